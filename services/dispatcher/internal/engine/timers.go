package engine

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// MaxExtend bounds one lease extension.
const MaxExtend = 24 * time.Hour

// ErrNotRunning is wrapped by Touch when the attempt is not running (any
// more): its lease expired and the task went back to the queue, it ended, or
// there is no such attempt.
var ErrNotRunning = fault.Preconditionf("attempt is not running")

// Touch extends a running attempt's lease to now+extend (zero: the task's
// timeout; at most MaxExtend) and returns the new lease end: a LeaseExtended
// change, so a new owner of the partition keeps the lease.
func (p *Partition) Touch(ns string, id uuid.UUID, attempt int32, extend time.Duration, now time.Time) (time.Time, []Change, error) {
	if extend < 0 {
		return time.Time{}, nil, fault.Invalidf("extend_ms must not be negative")
	}
	e, ok := p.tasks[id]
	if !ok || e.t.Status != store.Running || e.t.Namespace != ns || e.t.Attempt != attempt {
		return time.Time{}, nil, fmt.Errorf("touch task %s attempt %d: %w", id, attempt, ErrNotRunning)
	}
	p.advance(now)
	extend = min(extend, MaxExtend)
	if extend == 0 {
		extend = e.t.Settings.Timeout
	}
	t := e.t
	t.LeaseUntil, t.UpdatedAt = now.Add(extend), now
	p.put(e, t)
	return t.LeaseUntil, []Change{{Type: taskevent.LeaseExtended, Task: t}}, nil
}

// Requeue queues a dead-lettered task again from attempt zero, its error
// cleared: a Requeued change. A task the partition does not hold (Load an
// evicted one first) is fault.NotFound, one that is not dead-lettered
// fault.Precondition; one whose payload was let go is ErrPayloadOut (Load
// it to give the payload back).
func (p *Partition) Requeue(ns string, id uuid.UUID, now time.Time) (Task, []Change, error) {
	e, ok := p.tasks[id]
	if !ok || e.t.Namespace != ns {
		return Task{}, nil, fmt.Errorf("requeue task %s: %w", id, fault.NotFoundf("task %s not found in namespace %s", id, ns))
	}
	if e.t.Status != store.DeadLettered {
		return Task{}, nil, fmt.Errorf("requeue task %s: %w", id, fault.Preconditionf("task %s is %s, not dead-lettered", id, e.t.Status))
	}
	if e.t.PayloadOut {
		return Task{}, nil, fmt.Errorf("requeue task %s: %w", id, ErrPayloadOut)
	}
	p.advance(now)
	t := e.t
	t.Status, t.Attempt, t.Error, t.TimedOut, t.ErrorCode = store.Queued, 0, "", false, ""
	t.RunAt, t.FinishedAt, t.LeaseUntil, t.UpdatedAt = now, time.Time{}, time.Time{}, now
	p.put(e, t)
	return t, []Change{{Type: taskevent.Requeued, Task: t}}, nil
}

// Tick applies what time did by now: a running attempt whose lease ended
// (its worker went silent) is queued again with the attempt counted, as
// timed out (LeaseExpired), or dead-lettered when it was the last attempt
// (LeaseExpired, then DeadLettered); a waiting attempt whose async deadline
// passed fails as timed out (Failed). Queued tasks due by now become
// claimable. A lease or deadline ends at its instant, so ticking at NextDue
// does what is due.
func (p *Partition) Tick(now time.Time) []Change {
	p.advance(now)
	n := now.UnixNano()
	var out []Change
	for it := p.leases.top(); it != nil && it.at <= n; it = p.leases.top() {
		e := take(&p.leases)
		t := e.t
		t.Error, t.TimedOut, t.ErrorCode, t.LeaseUntil, t.UpdatedAt = "lease expired", true, "", time.Time{}, now
		if t.Attempt >= t.Settings.MaxAttempts {
			t.Status, t.FinishedAt = store.DeadLettered, now
			p.put(e, t)
			out = append(out, Change{Type: taskevent.LeaseExpired, Task: t}, Change{Type: taskevent.DeadLettered, Task: t})
			continue
		}
		t.Status, t.RunAt = store.Queued, now
		p.put(e, t)
		out = append(out, Change{Type: taskevent.LeaseExpired, Task: t})
	}
	for it := p.deadlines.top(); it != nil && it.at <= n; it = p.deadlines.top() {
		e := take(&p.deadlines)
		t := e.t
		t.Status, t.Error, t.TimedOut, t.ErrorCode = store.Failed, "no result by the async deadline", true, ""
		t.CompleteBy, t.FinishedAt, t.UpdatedAt = time.Time{}, now, now
		p.put(e, t)
		out = append(out, Change{Type: taskevent.Failed, Task: t})
	}
	return out
}

// NextDue is the earliest time Tick or Ready would change anything: a lease
// end, an async deadline, a queued task's run_at; zero when there is none.
func (p *Partition) NextDue() time.Time {
	var next time.Time
	consider := func(h *heap, due func(t *Task) time.Time) {
		if it := h.top(); it != nil && (next.IsZero() || it.at < next.UnixNano()) {
			next = due(&it.e.t)
		}
	}
	consider(&p.leases, func(t *Task) time.Time { return t.LeaseUntil })
	consider(&p.deadlines, func(t *Task) time.Time { return t.CompleteBy })
	consider(&p.delayed, func(t *Task) time.Time { return t.RunAt })
	return next
}
