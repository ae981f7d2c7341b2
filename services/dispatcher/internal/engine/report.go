package engine

import (
	"time"

	"github.com/google/uuid"

	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// MaxNackDelay bounds a nack's delay.
const MaxNackDelay = 7 * 24 * time.Hour

// How long a pending attempt waits for its result by completion token:
// DefaultAsyncTimeout when the worker named no time, at most MaxAsyncTimeout.
const (
	DefaultAsyncTimeout = 24 * time.Hour
	MaxAsyncTimeout     = 7 * 24 * time.Hour
)

// Kind is how an attempt ended.
type Kind int

// Report kinds.
const (
	// Complete: the handler succeeded.
	Complete Kind = iota + 1
	// Fail: the handler failed; Retry and NonRetryable say what happens next.
	Fail
	// Nack: the worker hands the task back to run again after Delay, counting the attempt.
	Nack
	// Abandon: the worker hands the task back at once without counting the attempt.
	Abandon
	// Pending: the handler accepted the work and its result comes later, by
	// completion token, within Delay.
	Pending
)

// Report is one worker's account of one attempt.
type Report struct {
	TaskID  string
	Attempt int32
	Kind    Kind
	// Result and Outcome of a completed attempt.
	Result  []byte
	Outcome string
	// Error of a failed attempt, or the reason of a nack.
	Error string
	// Retry, for Fail: false dead-letters the task at once.
	Retry bool
	// NonRetryable, for Fail: fail the task at once, without dead-lettering.
	NonRetryable bool
	// TimedOut, for Fail: the handler ran out of time. It does not change
	// what happens next; the task and its events record it.
	TimedOut bool
	// ErrorCode, for Fail: the worker's code for the failure, which the
	// task and its events record; an invalid one is dropped (text.CleanFailure).
	ErrorCode string
	// Delay, for Nack; for Pending, how long to wait for the result (zero:
	// DefaultAsyncTimeout).
	Delay time.Duration
	// TraceContext is the W3C trace context of the span the report happened
	// in (the worker's handler span, or the owner's span recording the
	// report); the changes it causes carry it.
	TraceContext map[string]string
}

// Report applies one worker report to the running attempt it names, which
// must be a task of ns: a completion completes the task; a failure fails it
// (NonRetryable), dead-letters it (no Retry, or no attempt left) or queues it
// again after the task's backoff; a nack queues it again after its delay
// (capped at MaxNackDelay) or dead-letters it when no attempt is left; an
// abandon queues it at once and takes the attempt back, keeping the last
// error; a pending answer makes it wait for its result by completion token.
// A failure's TimedOut and ErrorCode go on the task; a nack clears them. A
// report that matches no running attempt (a lease that expired, a task
// already final, an unknown or malformed id, another namespace) returns
// false and changes nothing; one that matches returns true and appends its
// change to changes.
func (p *Partition) Report(changes []Change, ns string, r Report, now time.Time) (bool, []Change) {
	id, err := uuid.Parse(r.TaskID)
	if err != nil || r.Kind < Complete || r.Kind > Pending {
		return false, changes
	}
	e, held := p.tasks[id]
	if !held || e.t.Status != store.Running || e.t.Namespace != ns || e.t.Attempt != r.Attempt {
		return false, changes
	}
	p.advance(now)
	// Free text is repaired, not refused: refusing would leave the task
	// running until its lease expired.
	r.Error, r.ErrorCode = text.CleanFailure(r.Error, r.ErrorCode)
	r.Outcome = text.Clean(r.Outcome, text.MaxOutcomeBytes)
	t := e.t
	t.LeaseUntil, t.UpdatedAt = time.Time{}, now
	typ := decide(&t, r, now)
	p.put(e, t)
	c := Change{Type: typ, Task: t}.madeTo(e)
	if len(r.TraceContext) > 0 {
		c.TraceHeaders = r.TraceContext
	}
	return true, append(changes, c)
}

// decide moves the running task t as report r says and returns the event.
func decide(t *Task, r Report, now time.Time) taskevent.Type {
	// end records a failure (or a nack's reason) on the task.
	end := func(status store.Status, msg string) {
		t.Status, t.Error, t.TimedOut, t.ErrorCode = status, msg, false, ""
		if r.Kind == Fail {
			t.TimedOut, t.ErrorCode = r.TimedOut, r.ErrorCode
		}
		if status != store.Queued {
			t.FinishedAt = now
		}
	}
	retry := func(delay time.Duration, msg string) taskevent.Type {
		if t.Attempt < t.Settings.MaxAttempts {
			end(store.Queued, msg)
			t.RunAt = now.Add(delay)
			return taskevent.RetryScheduled
		}
		end(store.DeadLettered, msg)
		return taskevent.DeadLettered
	}
	switch r.Kind {
	case Complete:
		t.Status, t.Result, t.Outcome = store.Completed, r.Result, r.Outcome
		t.Error, t.TimedOut, t.ErrorCode, t.FinishedAt = "", false, "", now
		return taskevent.Completed
	case Abandon:
		t.Status, t.Attempt, t.RunAt = store.Queued, t.Attempt-1, now
		return taskevent.Abandoned
	case Pending:
		wait := r.Delay
		if wait <= 0 {
			wait = DefaultAsyncTimeout
		}
		t.Status, t.CompleteBy = store.Waiting, now.Add(min(wait, MaxAsyncTimeout))
		return taskevent.Waiting
	case Nack:
		msg := r.Error
		if msg == "" {
			msg = "nacked"
		}
		return retry(min(max(r.Delay, 0), MaxNackDelay), msg)
	default:
		switch {
		case r.NonRetryable:
			end(store.Failed, r.Error)
			return taskevent.Failed
		case !r.Retry:
			end(store.DeadLettered, r.Error)
			return taskevent.DeadLettered
		default:
			return retry(t.Settings.Backoff.Delay(int(t.Attempt)), r.Error)
		}
	}
}
