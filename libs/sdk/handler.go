package flo

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName identifies the SDK's spans among the application's.
const tracerName = "github.com/razorbill/flo-go"

// tracer makes the SDK's spans. Taken once: the global provider's tracers
// follow the provider the application sets later, and asking the provider
// for one per task cost as much as the rest of starting the task's span.
var tracer = otel.Tracer(tracerName)

// handlerFunc is the one shape every registered handler is adapted to.
type handlerFunc func(*ActionContext) (outcome string, body []byte, err error)

// UnsupportedHandlerError is returned when a handler is neither a
// func(*ActionContext) ([]byte, error) nor a func(*ActionContext) (interface{}, error).
type UnsupportedHandlerError struct {
	Action  string
	Handler any
}

// Error names the action and the handler's type.
func (e *UnsupportedHandlerError) Error() string {
	return fmt.Sprintf("flo: handler for action %s has type %T; want func(*flo.ActionContext) ([]byte, error) or func(*flo.ActionContext) (interface{}, error)", e.Action, e.Handler)
}

// adaptHandler checks the handler's type once, at registration, so a wrong handler fails
// there rather than on the first task.
func adaptHandler(action string, handler any) (handlerFunc, error) {
	switch fn := handler.(type) {
	case func(*ActionContext) ([]byte, error):
		if fn == nil {
			break
		}
		return func(actx *ActionContext) (string, []byte, error) {
			body, err := fn(actx)
			return "", body, err
		}, nil
	case func(*ActionContext) (interface{}, error):
		if fn == nil {
			break
		}
		return func(actx *ActionContext) (string, []byte, error) {
			v, err := fn(actx)
			if err != nil {
				return "", nil, err
			}
			if named, ok := v.(*namedOutcome); ok {
				return named.outcome, named.body, nil
			}
			body, err := encodeResult(v)
			if err != nil {
				// The same value would fail to encode on every attempt.
				return "", nil, NewNonRetryableErrorf("encode result: %w", err)
			}
			return "", body, nil
		}, nil
	}
	return nil, &UnsupportedHandlerError{Action: action, Handler: handler}
}

// panicError carries a recovered panic as a handler error; it is retried like any other.
type panicError struct {
	value any
	stack []byte
}

// Error is what the task's error records: the panic value.
func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }

// call runs the handler, turning a panic into an error so one bad task cannot take the
// worker down.
func call(h handlerFunc, actx *ActionContext) (outcome string, body []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{value: r, stack: debug.Stack()}
		}
	}()
	return h(actx)
}

// report turns the end of one attempt into the message that tells the server. timedOut says
// the handler's context reached its deadline before the handler returned: a failure then
// says so, and a workflow step sees the task's timeout outcome when that was its last attempt.
func report(task *flov1.TaskAssignment, outcome string, body []byte, err error, timedOut bool) *flov1.WorkerMessage {
	id, attempt := task.GetTaskId(), task.GetAttempt()
	if err == nil {
		return resultMessage(&flov1.Result{
			TaskId:  id,
			Attempt: attempt,
			Outcome: &flov1.Result_Completed{Completed: &flov1.Completed{Body: body, Outcome: outcome}},
		})
	}
	kind, delay := classify(err)
	switch kind {
	case dispositionPending:
		return resultMessage(&flov1.Result{TaskId: id, Attempt: attempt, Outcome: &flov1.Result_Pending{Pending: &flov1.Pending{TimeoutMs: delay.Milliseconds()}}})
	case dispositionAbandon:
		return &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Abandon{Abandon: &flov1.Abandon{TaskId: id, Attempt: attempt}}}
	case dispositionNack:
		return &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Nack{Nack: &flov1.Nack{
			TaskId: id, Attempt: attempt, DelayMs: delay.Milliseconds(), Reason: wireText(err.Error()),
		}}}
	}
	failed := &flov1.Failed{Error: wireText(err.Error()), TimedOut: timedOut, ErrorCode: wireText(ErrorCode(err))}
	switch kind {
	case dispositionNonRetryable:
		failed.NonRetryable = true
	case dispositionRetry:
		failed.Retry = true
	}
	return resultMessage(&flov1.Result{TaskId: id, Attempt: attempt, Outcome: &flov1.Result_Failed{Failed: failed}})
}

func resultMessage(r *flov1.Result) *flov1.WorkerMessage {
	return &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: r}}
}

// execute runs one attempt of task with h inside its trace span and returns the message that
// reports it. The handler's context has the values of the context Start was given, without
// its cancellation: handlers finish even when the worker is stopping.
func (w *ActionWorker) execute(task *flov1.TaskAssignment, h handlerFunc) *flov1.WorkerMessage {
	parent := w.parent(task.GetTraceContext())
	ctx, span := tracer.Start(parent, "flo.action "+task.GetAction(), trace.WithSpanKind(trace.SpanKindConsumer))
	defer span.End()
	// Set once the span records, so a worker that exports no traces does
	// not build them for every task only to drop them. The sampler, which
	// runs at the start, does not see them.
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("flo.task.id", task.GetTaskId()),
			attribute.String("flo.action", task.GetAction()),
			attribute.Int("flo.task.attempt", int(task.GetAttempt())),
			attribute.String("flo.namespace", w.client.namespace),
			attribute.String("flo.worker.id", w.opts.WorkerID),
		)
	}
	ctx, cancel := context.WithTimeout(ctx, w.opts.ActionTimeout)
	defer cancel()

	actx := &ActionContext{
		Context:     ctx,
		taskID:      task.GetTaskId(),
		action:      task.GetAction(),
		attempt:     int(task.GetAttempt()),
		maxAttempts: int(task.GetMaxAttempts()),
		createdAt:   timeFromProto(task.GetCreatedAt()),
		payload:     task.GetPayload(),
		token:       task.GetCompletionToken(),
	}
	actx.touch = func(ctx context.Context, extendMS int64) error {
		return w.touch(ctx, task, extendMS)
	}

	outcome, body, err := call(h, actx)
	if err != nil {
		var p *panicError
		if errors.As(err, &p) {
			w.log.Error("flo: action handler panicked", "action", task.GetAction(), "task_id", task.GetTaskId(),
				"attempt", task.GetAttempt(), "panic", fmt.Sprint(p.value), "stack", string(p.stack))
		}
		if !errors.Is(err, ErrAbandon) {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	} else if outcome != "" {
		span.SetAttributes(attribute.String("flo.outcome", outcome))
	}
	msg := report(task, outcome, body, err, errors.Is(ctx.Err(), context.DeadlineExceeded))
	if r := msg.GetResult(); r != nil {
		// The server records the result under the handler's span. A span
		// that was not made (nothing records spans here) is the task's own
		// context, which the task's map already carries.
		if !span.IsRecording() && span.SpanContext().Equal(trace.SpanContextFromContext(parent)) {
			r.TraceContext = task.GetTraceContext()
		} else {
			r.TraceContext = map[string]string{}
			otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(r.TraceContext))
		}
	}
	return msg
}
