// Package taskwait lets a request wait for a task to reach a final state
// without polling. Every gateway replica tails the task-outcomes topic from its
// end; an event that finishes a task wakes the requests waiting on that task
// id in this process. Waiters exist only while a request waits, so memory
// follows the number of concurrent waits, which is capped.
package taskwait

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// ErrTooManyWaiters reports that the process already holds its maximum
// number of waiting requests.
var ErrTooManyWaiters = errors.New("too many concurrent waits")

// ErrClosed reports a registry that was closed: the process is shutting down
// and waits end at once.
var ErrClosed = errors.New("task waits are closed")

// Registry holds the waiters, keyed by task id.
type Registry struct {
	max int

	mu      sync.Mutex
	count   int
	closed  bool
	waiters map[string]map[chan struct{}]struct{}
}

// NewRegistry returns a Registry holding at most max waiters at once.
func NewRegistry(max int) *Registry {
	return &Registry{max: max, waiters: make(map[string]map[chan struct{}]struct{})}
}

// Register adds a waiter for taskID. The returned channel is closed when an
// event finishing the task arrives or the registry closes; release removes the
// waiter and must be called once the caller stops waiting. After Close it
// returns ErrClosed.
func (r *Registry) Register(taskID string) (done <-chan struct{}, release func(), err error) {
	ch := make(chan struct{})
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, nil, ErrClosed
	}
	if r.count >= r.max {
		return nil, nil, ErrTooManyWaiters
	}
	set := r.waiters[taskID]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		r.waiters[taskID] = set
	}
	set[ch] = struct{}{}
	r.count++
	return ch, func() { r.release(taskID, ch) }, nil
}

func (r *Registry) release(taskID string, ch chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.waiters[taskID]
	if _, ok := set[ch]; !ok {
		return
	}
	delete(set, ch)
	r.count--
	if len(set) == 0 {
		delete(r.waiters, taskID)
	}
}

// Notify wakes every waiter of taskID and removes them.
func (r *Registry) Notify(taskID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.waiters[taskID]
	for ch := range set {
		close(ch)
	}
	r.count -= len(set)
	delete(r.waiters, taskID)
}

func (r *Registry) waited(taskID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.waiters[taskID]
	return ok
}

// Close wakes every waiter, so waits end at once on shutdown, and makes later
// registrations fail with ErrClosed.
func (r *Registry) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, set := range r.waiters {
		for ch := range set {
			close(ch)
		}
	}
	r.waiters = make(map[string]map[chan struct{}]struct{})
	r.count = 0
}

// Len returns the number of waiters.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Handler returns the batch handler of the task-outcomes tail. Records of tasks
// nobody here waits for are skipped without decoding, which keeps the tail
// cheap under load; a record that does not decode is returned as
// kafka.Poison, which the tail logs, counts and skips.
func (r *Registry) Handler() func(ctx context.Context, records []*kgo.Record) error {
	return func(_ context.Context, records []*kgo.Record) error {
		var poison []error
		for _, rec := range records {
			if !r.waited(string(rec.Key)) {
				continue
			}
			var ev eventsv1.TaskEvent
			// Only the dispatcher writes task events (proto/codec says why that matters).
			if err := ev.UnmarshalVT(rec.Value); err != nil {
				poison = append(poison, kafka.Poison(rec, fmt.Errorf("decode TaskEvent: %w", err)))
				continue
			}
			if finishes(&ev) {
				r.Notify(ev.GetTaskId())
			}
		}
		return errors.Join(poison...)
	}
}

// Final reports whether a task in this status will never change again
// (unless a dead letter is requeued by hand).
func Final(s flov1.TaskStatus) bool {
	switch s {
	case flov1.TaskStatus_TASK_STATUS_COMPLETED,
		flov1.TaskStatus_TASK_STATUS_FAILED,
		flov1.TaskStatus_TASK_STATUS_DEAD_LETTERED:
		return true
	}
	return false
}

// finishes reports whether the event leaves its task in a final state; the
// status says so when it is set, the event type otherwise.
func finishes(ev *eventsv1.TaskEvent) bool {
	if ev.GetStatus() != flov1.TaskStatus_TASK_STATUS_UNSPECIFIED {
		return Final(ev.GetStatus())
	}
	switch ev.GetType() {
	case eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED:
		return true
	}
	return false
}
