package flo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// ActionContext is what a handler receives: the task it runs and a [context.Context] for the
// work. The context carries the handler's trace span and ends when the worker's ActionTimeout
// passes; it is not cancelled when the worker is asked to stop, because a stopping worker
// lets its handlers finish.
type ActionContext struct {
	context.Context

	taskID      string
	action      string
	attempt     int
	maxAttempts int
	createdAt   time.Time
	payload     []byte
	token       string
	touch       func(ctx context.Context, extendMS int64) error
}

// TaskID returns the id of the task being run.
func (a *ActionContext) TaskID() string { return a.taskID }

// CompletionToken returns this attempt's completion token. A handler that returns
// ErrResultPending hands it to whoever will deliver the result (a webhook's sender, another
// service), who calls Client.CompleteTask or Client.FailTask with it. It names this attempt
// only and cannot be derived from the task id.
func (a *ActionContext) CompletionToken() string { return a.token }

// ActionName returns the action the task belongs to.
func (a *ActionContext) ActionName() string { return a.action }

// Attempt returns the attempt number, 1 for the first run and one more on every retry.
func (a *ActionContext) Attempt() int { return a.attempt }

// MaxAttempts returns how many attempts the task has in all.
func (a *ActionContext) MaxAttempts() int { return a.maxAttempts }

// CreatedAt returns when the task was invoked.
func (a *ActionContext) CreatedAt() time.Time { return a.createdAt }

// Payload returns the task's input as it was sent. The slice must not be modified.
func (a *ActionContext) Payload() []byte { return a.payload }

// Into decodes the JSON payload into v. An empty payload leaves v as it is.
func (a *ActionContext) Into(v any) error {
	if len(a.payload) == 0 {
		return nil
	}
	if err := json.Unmarshal(a.payload, v); err != nil {
		return fmt.Errorf("decode payload of task %s: %w", a.taskID, err)
	}
	return nil
}

// Bytes encodes v as JSON, the usual body of a ([]byte, error) handler's result.
func (a *ActionContext) Bytes(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode result of task %s: %w", a.taskID, err)
	}
	return b, nil
}

// Result completes the task with a named outcome, which a workflow uses to pick its next step,
// and v as the body (encoded like any (interface{}, error) handler result). Return its values
// from an (interface{}, error) handler.
func (a *ActionContext) Result(outcome string, v any) (interface{}, error) {
	body, err := encodeResult(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s result of task %s: %w", outcome, a.taskID, err)
	}
	return &namedOutcome{outcome: outcome, body: body}, nil
}

// Touch extends the task's lease by extendMs milliseconds from now, so a long handler keeps
// the task past its action's timeout. It waits for the server's answer and returns an error if
// the lease could not be extended, for example because it had already expired and the task
// went to another worker; the handler should then stop.
func (a *ActionContext) Touch(extendMs int64) error {
	return a.touch(a, extendMs)
}

// namedOutcome is the value [ActionContext.Result] returns; the worker recognises it among the
// values an (interface{}, error) handler returns.
type namedOutcome struct {
	outcome string
	body    []byte
}

// encodeResult turns an (interface{}, error) handler's value into a result body.
func encodeResult(v any) ([]byte, error) {
	switch r := v.(type) {
	case nil:
		return nil, nil
	case []byte:
		return r, nil
	case json.RawMessage:
		return r, nil
	default:
		return json.Marshal(r)
	}
}
