package grpcapi

import (
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/libs/millis"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

var backoffKinds = map[flov1.BackoffKind]backoff.Kind{
	flov1.BackoffKind_BACKOFF_KIND_CONSTANT:           backoff.Constant,
	flov1.BackoffKind_BACKOFF_KIND_LINEAR:             backoff.Linear,
	flov1.BackoffKind_BACKOFF_KIND_EXPONENTIAL:        backoff.Exponential,
	flov1.BackoffKind_BACKOFF_KIND_EXPONENTIAL_JITTER: backoff.ExponentialJitter,
	flov1.BackoffKind_BACKOFF_KIND_CAPPED:             backoff.Capped,
}

// backoffKindName maps the API enum to the domain name: unspecified to ""
// (the default), and unknown values to a name validation rejects.
func backoffKindName(k flov1.BackoffKind) string {
	if k == flov1.BackoffKind_BACKOFF_KIND_UNSPECIFIED {
		return ""
	}
	if name, ok := backoffKinds[k]; ok {
		return string(name)
	}
	return fmt.Sprintf("BackoffKind(%d)", int32(k))
}

func backoffKindProto(k backoff.Kind) flov1.BackoffKind {
	for p, d := range backoffKinds {
		if d == k {
			return p
		}
	}
	return flov1.BackoffKind_BACKOFF_KIND_UNSPECIFIED
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func namespaceProto(n store.Namespace) *flov1.Namespace {
	return &flov1.Namespace{Name: n.Name, CreatedAt: timestamp(n.CreatedAt)}
}

func actionProto(a store.Action) *flov1.Action {
	return &flov1.Action{
		Namespace:   a.Namespace,
		Name:        a.Name,
		TimeoutMs:   a.Timeout.Milliseconds(),
		MaxAttempts: a.MaxAttempts,
		Backoff: &flov1.Backoff{
			Kind:           backoffKindProto(a.Backoff.Kind),
			InitialDelayMs: a.Backoff.Initial.Milliseconds(),
			MaxDelayMs:     a.Backoff.Max.Milliseconds(),
			Multiplier:     a.Backoff.Multiplier,
		},
		Enabled:   a.Enabled,
		CreatedAt: timestamp(a.CreatedAt),
		UpdatedAt: timestamp(a.UpdatedAt),
	}
}

func actionsProto(as []store.Action) []*flov1.Action {
	out := make([]*flov1.Action, len(as))
	for i, a := range as {
		out[i] = actionProto(a)
	}
	return out
}

func taskProto(t store.Task) *flov1.Task {
	return &flov1.Task{
		Id:             t.ID.String(),
		Namespace:      t.Namespace,
		Action:         t.Action,
		Status:         taskevent.Status(t.Status),
		Attempt:        t.Attempt,
		MaxAttempts:    t.MaxAttempts,
		Priority:       t.Priority,
		Payload:        t.Payload,
		Result:         t.Result,
		Output:         jsonValue(t.Result),
		Outcome:        t.Outcome,
		Error:          t.Error,
		TimedOut:       t.TimedOut,
		ErrorCode:      t.ErrorCode,
		IdempotencyKey: t.IdempotencyKey,
		WorkerId:       t.WorkerID,
		CreatedAt:      timestamp(t.CreatedAt),
		RunAt:          timestamp(t.RunAt),
		StartedAt:      timestamp(t.StartedAt),
		FinishedAt:     timestamp(t.FinishedAt),
		UpdatedAt:      timestamp(t.UpdatedAt),
		CompleteBy:     timestamp(t.CompleteBy),
	}
}

// jsonValue decodes a result that is JSON; anything else has no output.
func jsonValue(b []byte) *structpb.Value {
	if len(b) == 0 || !json.Valid(b) {
		return nil
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(b, v); err != nil {
		return nil
	}
	return v
}

func assignmentProto(c engine.Claimed) *flov1.TaskAssignment {
	t := c.Task
	return &flov1.TaskAssignment{
		TaskId:       t.ID.String(),
		Action:       t.Action,
		Payload:      t.Payload,
		Attempt:      t.Attempt,
		MaxAttempts:  t.Settings.MaxAttempts,
		CreatedAt:    timestamp(t.CreatedAt),
		LeaseUntil:   timestamp(t.LeaseUntil),
		TraceContext: t.TraceContext,
		// A claimed attempt always has a secret; String refuses anything else.
		CompletionToken: engine.Token{ID: t.ID, Attempt: t.Attempt, Secret: t.CompletionSecret}.String(),
	}
}

func reportDomain(r *dispatcherv1.Report) engine.Report {
	out := engine.Report{TaskID: r.GetTaskId(), Attempt: r.GetAttempt(), TraceContext: r.GetTraceContext()}
	switch k := r.GetKind().(type) {
	case *dispatcherv1.Report_Completed:
		out.Kind, out.Result, out.Outcome = engine.Complete, k.Completed.GetBody(), k.Completed.GetOutcome()
	case *dispatcherv1.Report_Failed:
		out.Kind, out.Error = engine.Fail, k.Failed.GetError()
		out.Retry, out.NonRetryable, out.TimedOut = k.Failed.GetRetry(), k.Failed.GetNonRetryable(), k.Failed.GetTimedOut()
		out.ErrorCode = k.Failed.GetErrorCode()
	case *dispatcherv1.Report_Nack:
		out.Kind, out.Error, out.Delay = engine.Nack, k.Nack.GetReason(), millis.Duration(k.Nack.GetDelayMs())
	case *dispatcherv1.Report_Abandon:
		out.Kind = engine.Abandon
	case *dispatcherv1.Report_Pending:
		out.Kind, out.Delay = engine.Pending, millis.Duration(k.Pending.GetTimeoutMs())
	}
	return out
}
