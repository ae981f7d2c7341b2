package flo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrAbandon, returned by a handler (or wrapped in its error), hands the task back to the queue
// at once without counting the attempt: the right answer when the worker cannot run the task
// now for reasons that have nothing to do with the task.
var ErrAbandon = errors.New("flo: task abandoned")

// ErrResultPending, returned by a handler, says it accepted the work and the result comes
// later, as in Temporal's asynchronous activity completion: whoever holds the attempt's
// ActionContext.CompletionToken calls Client.CompleteTask or Client.FailTask. The worker's slot
// is free at once and the task waits, without a lease, for 24 hours (see ResultPendingWithin);
// no result by then fails it as timed out, with no further attempt.
var ErrResultPending = errors.New("flo: result pending")

// ResultPendingError is ErrResultPending with its own deadline.
type ResultPendingError struct {
	// Timeout is how long the task waits for its result; zero means 24 hours, and the
	// server caps it at 7 days.
	Timeout time.Duration
}

// ResultPendingWithin says the result comes later, within timeout.
func ResultPendingWithin(timeout time.Duration) error { return &ResultPendingError{Timeout: timeout} }

// Error says the result is pending.
func (e *ResultPendingError) Error() string {
	return fmt.Sprintf("flo: result pending within %s", e.Timeout)
}

// Is makes errors.Is(err, ErrResultPending) true.
func (e *ResultPendingError) Is(target error) bool { return target == ErrResultPending }

// NonRetryableError marks a failure that retrying cannot fix (invalid input, a business rule).
// The task fails at once: no further attempts, no dead-letter queue.
type NonRetryableError struct {
	Err error
}

// NewNonRetryableError marks err as not worth retrying.
func NewNonRetryableError(err error) error {
	return &NonRetryableError{Err: err}
}

// NewNonRetryableErrorf formats a message (with %w support) and marks it as not worth retrying.
func NewNonRetryableErrorf(format string, args ...any) error {
	return &NonRetryableError{Err: fmt.Errorf(format, args...)}
}

// Error returns the wrapped error's message.
func (e *NonRetryableError) Error() string { return errorText(e.Err) }

// Unwrap returns the wrapped error.
func (e *NonRetryableError) Unwrap() error { return e.Err }

// DeadLetterError fails the attempt and sends the task straight to the dead-letter queue, where
// an operator can inspect and requeue it; it is the explicit fail(retry=false).
type DeadLetterError struct {
	Err error
}

// NewDeadLetterError sends the task to the dead-letter queue with err as its error.
func NewDeadLetterError(err error) error {
	return &DeadLetterError{Err: err}
}

// NewDeadLetterErrorf formats a message (with %w support) and sends the task to the
// dead-letter queue with it.
func NewDeadLetterErrorf(format string, args ...any) error {
	return &DeadLetterError{Err: fmt.Errorf(format, args...)}
}

// Error returns the wrapped error's message.
func (e *DeadLetterError) Error() string { return errorText(e.Err) }

// Unwrap returns the wrapped error.
func (e *DeadLetterError) Unwrap() error { return e.Err }

// NackError returns the task to the queue to run again after Delay. The attempt counts, as a
// failure would, but the retry happens when the handler chose rather than when the action's
// backoff policy says: use it for an upstream rate limit or a lock held elsewhere.
type NackError struct {
	Delay time.Duration
	Err   error
}

// NewNackErrorf formats a reason (with %w support) and asks for the task to run again after
// delay.
func NewNackErrorf(delay time.Duration, format string, args ...any) error {
	return &NackError{Delay: delay, Err: fmt.Errorf(format, args...)}
}

// Error returns the wrapped error's message.
func (e *NackError) Error() string { return errorText(e.Err) }

// Unwrap returns the wrapped error.
func (e *NackError) Unwrap() error { return e.Err }

// CodedError is a failure carrying a code: a short identifier ("card_declined", "rate_limited")
// that classifies it. The task, its events and `flo task get` show the code, and workflows can
// tell failures apart by it. The code does not change how the task is retried: wrap a CodedError
// in NewNonRetryableError (or a NonRetryableError in NewErrorWithCode's %w) to fail at once.
// A code is 1 to 64 letters, digits, '_', '.', ':' or '-', not starting with '.', ':' or '-';
// the server drops an invalid code, keeping the failure and noting the drop in its error.
type CodedError struct {
	Code string
	Err  error
}

// NewErrorWithCode formats a message (with %w support) as a failure with code. It is retried
// as the action's policy says, like any error.
func NewErrorWithCode(code, format string, args ...any) error {
	return &CodedError{Code: code, Err: fmt.Errorf(format, args...)}
}

// Error returns the wrapped error's message.
func (e *CodedError) Error() string { return errorText(e.Err) }

// Unwrap returns the wrapped error.
func (e *CodedError) Unwrap() error { return e.Err }

// ErrorCode returns the code of the first CodedError in err's chain, or "" when there is none.
func ErrorCode(err error) string {
	var coded *CodedError
	if errors.As(err, &coded) {
		return coded.Code
	}
	return ""
}

func errorText(err error) string {
	if err == nil {
		return "unknown error"
	}
	return err.Error()
}

// wireText is text a worker sends the gateway: bytes that are not UTF-8
// become U+FFFD, since the gateway refuses a message with such a string,
// and one handler's odd error must not end the worker's stream.
func wireText(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// disposition is how a finished attempt is reported to the server.
type disposition int

const (
	dispositionRetry        disposition = iota // Failed{retry: true}
	dispositionNonRetryable                    // Failed{non_retryable: true}
	dispositionDeadLetter                      // Failed{retry: false}
	dispositionNack                            // Nack{delay}
	dispositionAbandon                         // Abandon
	dispositionPending                         // Result{pending: {timeout}}
)

// classify decides what a handler's error means for its task. The order matters when one error
// wraps several markers: handing the task back wins over failing it, and an explicit marker
// wins over a context error it may wrap.
func classify(err error) (disposition, time.Duration) {
	var nack *NackError
	var nonRetryable *NonRetryableError
	var deadLetter *DeadLetterError
	var pending *ResultPendingError
	switch {
	case errors.As(err, &pending):
		return dispositionPending, max(pending.Timeout, 0)
	case errors.Is(err, ErrResultPending):
		return dispositionPending, 0
	case errors.Is(err, ErrAbandon):
		return dispositionAbandon, 0
	case errors.As(err, &nack):
		return dispositionNack, max(nack.Delay, 0)
	case errors.As(err, &nonRetryable):
		return dispositionNonRetryable, 0
	case errors.As(err, &deadLetter):
		return dispositionDeadLetter, 0
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return dispositionNonRetryable, 0
	default:
		return dispositionRetry, 0
	}
}
