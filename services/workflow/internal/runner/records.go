package runner

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/outbox"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// parseOrigin splits a task origin into run id and wait token; ok is false
// for tasks the workflow service did not invoke.
func parseOrigin(origin string) (runID, token string, ok bool) {
	runID, token, ok = engine.ParseOrigin(origin)
	if !ok {
		return "", "", false
	}
	if _, err := uuid.Parse(runID); err != nil {
		return "", "", false
	}
	return runID, token, true
}

// invokeRecord is the InvokeTask command for inv, keyed by task id and
// carrying the trace context of the run's start, so the whole run is one
// trace.
func invokeRecord(run *store.Run, inv engine.Invoke, now time.Time) (outbox.Record, error) {
	cmd := &eventsv1.InvokeTask{
		EventId:     uuid.NewString(),
		TaskId:      inv.TaskID,
		Namespace:   run.Namespace,
		Action:      inv.Action,
		Payload:     inv.Payload,
		InvokedAt:   timestamppb.New(now),
		Origin:      inv.Origin,
		MaxAttempts: inv.MaxAttempts,
	}
	value, err := proto.Marshal(cmd)
	if err != nil {
		return outbox.Record{}, fmt.Errorf("encode InvokeTask for run %s: %w", run.ID, err)
	}
	return outbox.Record{Topic: kafka.CommandsTopic, Key: []byte(inv.TaskID), Value: value, Headers: run.TraceContext}, nil
}

// statusRecords are the RunEvents of an advance that took run from status
// before to its current one: STARTED when it left pending, ENDED when it
// reached a terminal, STATUS_CHANGED for any other change.
func statusRecords(run *store.Run, before engine.Status, now time.Time) ([]outbox.Record, error) {
	after := run.Status
	if after == before {
		return nil, nil
	}
	var types []eventsv1.RunEventType
	if before == engine.StatusPending {
		types = append(types, eventsv1.RunEventType_RUN_EVENT_TYPE_STARTED)
	}
	switch {
	case after.Ended():
		types = append(types, eventsv1.RunEventType_RUN_EVENT_TYPE_ENDED)
	case before != engine.StatusPending:
		types = append(types, eventsv1.RunEventType_RUN_EVENT_TYPE_STATUS_CHANGED)
	}
	out := make([]outbox.Record, 0, len(types))
	for _, typ := range types {
		ev := &eventsv1.RunEvent{
			EventId:     uuid.NewString(),
			Type:        typ,
			Namespace:   run.Namespace,
			RunId:       run.ID,
			Workflow:    run.Workflow,
			Version:     run.Version,
			Status:      RunStatus(after),
			Terminal:    run.Terminal,
			ParentRunId: run.ParentRunID,
			OccurredAt:  timestamppb.New(now),
		}
		value, err := proto.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("encode RunEvent for run %s: %w", run.ID, err)
		}
		out = append(out, outbox.Record{Topic: kafka.RunEventsTopic, Key: []byte(run.ID), Value: value, Headers: run.TraceContext})
	}
	return out, nil
}

// RunStatus maps an engine status to its API value.
func RunStatus(s engine.Status) flov1.RunStatus {
	switch s {
	case engine.StatusPending:
		return flov1.RunStatus_RUN_STATUS_PENDING
	case engine.StatusRunning:
		return flov1.RunStatus_RUN_STATUS_RUNNING
	case engine.StatusWaiting:
		return flov1.RunStatus_RUN_STATUS_WAITING
	case engine.StatusCompleted:
		return flov1.RunStatus_RUN_STATUS_COMPLETED
	case engine.StatusFailed:
		return flov1.RunStatus_RUN_STATUS_FAILED
	case engine.StatusCancelled:
		return flov1.RunStatus_RUN_STATUS_CANCELLED
	case engine.StatusTimedOut:
		return flov1.RunStatus_RUN_STATUS_TIMED_OUT
	}
	return flov1.RunStatus_RUN_STATUS_UNSPECIFIED
}

// StatusOf maps an API run status to the engine's; ok is false for
// UNSPECIFIED and unknown values.
func StatusOf(s flov1.RunStatus) (engine.Status, bool) {
	for _, st := range []engine.Status{engine.StatusPending, engine.StatusRunning, engine.StatusWaiting,
		engine.StatusCompleted, engine.StatusFailed, engine.StatusCancelled, engine.StatusTimedOut} {
		if RunStatus(st) == s {
			return st, true
		}
	}
	return "", false
}
