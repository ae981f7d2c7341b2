package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/protopeek"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
)

var tracer = otel.Tracer("github.com/razorbill/flo/services/workflow/internal/runner")

// originNumber is the number of TaskEvent's origin field.
var originNumber = (&eventsv1.TaskEvent{}).ProtoReflect().Descriptor().Fields().ByName("origin").Number()

// fromRun reports whether an encoded TaskEvent's origin says a run invoked
// its task, reading that field alone. decided is false when the bytes are
// not a well-formed message, so that the full decode says what is wrong.
func fromRun(b []byte) (ofRun, decided bool) {
	origin, ok := protopeek.Bytes(b, originNumber)
	return ok && bytes.HasPrefix(origin, []byte(engine.OriginPrefix)), ok
}

// taskEvent is a task event about a task a run waits for: its end, or its
// result being pending.
type taskEvent struct {
	runID, token string
	// ev is the engine's event, a TaskEnded or a TaskWaiting.
	ev any
	// outcome is the ended task's outcome; empty for a pending one.
	outcome string
}

// HandleTaskEvents is the kafka.BatchHandler for kafka.TaskOutcomesTopic. It keeps
// the events that end tasks runs invoked (COMPLETED, FAILED, DEAD_LETTERED,
// REJECTED with a workflow origin) or say their result is pending (WAITING),
// and applies them in one transaction with
// the events of the poll's other partitions; events of other tasks are
// skipped. A record that does not decode, or whose origin says it is a run's
// task but names no run, is returned as kafka.Poison once the others are
// applied: the consumer dead-letters it.
//
// When the consumer isolates a failed batch (kafka.Isolated), the events are
// applied in a transaction of their own: in the shared one, a bad event of
// another partition would fail them again, and the consumer would
// dead-letter a good record for it. Isolating at the consumer keeps the cost
// of a failure on the partition that has it and libs/coalesce unaware of
// what a failure means.
func (r *Runner) HandleTaskEvents(ctx context.Context, records []*kgo.Record) error {
	var (
		evs    []taskEvent
		spans  []trace.Span
		poison []error
	)
	for _, rec := range records {
		// Most task events are about tasks no run invoked: those are
		// skipped without decoding them.
		if ofRun, decided := fromRun(rec.Value); decided && !ofRun {
			continue
		}
		var ev eventsv1.TaskEvent
		// Only the dispatcher writes task events (proto/codec says why that matters).
		if err := ev.UnmarshalVT(rec.Value); err != nil {
			poison = append(poison, kafka.Poison(rec, fmt.Errorf("decode TaskEvent: %w", err)))
			continue
		}
		if o := ev.GetOrigin(); strings.HasPrefix(o, engine.OriginPrefix) {
			if _, _, ok := parseOrigin(o); !ok {
				poison = append(poison, kafka.Poison(rec, fmt.Errorf("task event origin %q names no run", o)))
				continue
			}
		}
		te, ok := taskEnded(&ev)
		if !ok {
			continue
		}
		// The event carries the trace of the run's start (through the task),
		// so the advance joins the run's trace.
		_, span := tracer.Start(kafka.ExtractTrace(ctx, rec), "advance run",
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(attribute.String("flo.run_id", te.runID), attribute.String("flo.task_id", ev.GetTaskId()),
				attribute.String("flo.outcome", te.outcome)))
		evs = append(evs, te)
		spans = append(spans, span)
	}
	var err error
	switch {
	case len(evs) == 0:
	case kafka.Isolated(ctx):
		err = r.applyEvents(ctx, evs)
	default:
		_, err = r.events.Do(ctx, evs)
	}
	for _, s := range spans {
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, "advance failed")
		}
		s.End()
	}
	if err != nil {
		return err
	}
	return errors.Join(poison...)
}

// taskEnded maps a task event to the engine's TaskEnded, or TaskWaiting for
// WAITING; ok is false for other events and tasks no run invoked.
func taskEnded(ev *eventsv1.TaskEvent) (taskEvent, bool) {
	runID, token, ok := parseOrigin(ev.GetOrigin())
	if !ok {
		return taskEvent{}, false
	}
	te := engine.TaskEnded{Token: token}
	switch ev.GetType() {
	case eventsv1.TaskEventType_TASK_EVENT_TYPE_WAITING:
		return taskEvent{runID: runID, token: token, ev: engine.TaskWaiting{Token: token}}, true
	case eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED:
		te.Outcome = ev.GetOutcome()
		if te.Outcome == "" {
			te.Outcome = definition.OutcomeSuccess
		}
		te.Output = outputJSON(ev.GetResult())
	case eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED:
		te.Outcome, te.Error, te.NonRetryable, te.TimedOut = definition.OutcomeFailure, ev.GetError(), ev.GetNonRetryable(), ev.GetTimedOut()
		te.ErrorCode = ev.GetErrorCode()
	case eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED:
		te.Outcome, te.Error, te.TimedOut = definition.OutcomeFailure, ev.GetError(), ev.GetTimedOut()
		te.ErrorCode = ev.GetErrorCode()
	case eventsv1.TaskEventType_TASK_EVENT_TYPE_REJECTED:
		te.Outcome, te.Error = ev.GetOutcome(), ev.GetError()
		if te.Outcome == "" {
			te.Outcome = definition.OutcomeExecutionFailure
		}
	default:
		return taskEvent{}, false
	}
	return taskEvent{runID: runID, token: token, ev: te, outcome: te.Outcome}, true
}

// outputJSON makes an action's result usable as a step output: JSON stays as
// it is, an empty result is null, and anything else becomes a JSON string of
// its text, so inputMapping and status output always see JSON.
func outputJSON(b []byte) json.RawMessage {
	switch {
	case len(b) == 0:
		return json.RawMessage("null")
	case json.Valid(b):
		return json.RawMessage(b)
	}
	s, _ := json.Marshal(strings.ToValidUTF8(string(b), "\uFFFD"))
	return s
}

// execEvents applies the task events of a consumer poll in one transaction.
func (r *Runner) execEvents(ctx context.Context, calls []*coalesce.Call[[]taskEvent, struct{}]) error {
	var evs []taskEvent
	for _, c := range calls {
		evs = append(evs, c.Req...)
	}
	return r.applyEvents(ctx, evs)
}

// applyEvents applies task events in one transaction, in log order per run.
// Events whose token the run has left (redeliveries, the second end event of
// a task, tasks of a cancelled run) change nothing.
func (r *Runner) applyEvents(ctx context.Context, evs []taskEvent) error {
	ids := make([]string, 0, len(evs))
	seen := map[string]bool{}
	for _, ev := range evs {
		if !seen[ev.runID] {
			seen[ev.runID] = true
			ids = append(ids, ev.runID)
		}
	}
	stale := 0
	err := r.inUnit(ctx, func(u *unit) error {
		stale = 0
		if err := u.lockRuns(ctx, ids, false); err != nil {
			return err
		}
		for _, ev := range evs {
			e := u.runs[ev.runID]
			if e == nil || e.run.Status.Ended() || e.run.Token != ev.token {
				stale++
				continue
			}
			if err := u.advance(ctx, e, ev.ev); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && stale > 0 {
		r.staleEvents.Add(ctx, int64(stale))
	}
	return err
}
