// Package taskevent names the task events on flo.tasks.events (their types
// and the statuses they report), says which of them go to flo.tasks.outcomes
// as well, and counts them; engine encodes them.
package taskevent

import (
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// Type is what happened to a task.
type Type int

// Event types, one per kind of state change.
const (
	Created Type = iota + 1
	Started
	Completed
	Failed
	RetryScheduled
	DeadLettered
	Requeued
	Abandoned
	LeaseExpired
	// Rejected: the invocation named an unknown or disabled action and no
	// task was created; the change's Outcome says which.
	Rejected
	// Waiting: the attempt's handler answered that its result comes later.
	Waiting
	// LeaseExtended: the worker holding the attempt extended its lease.
	LeaseExtended
)

var protoTypes = map[Type]eventsv1.TaskEventType{
	Created:        eventsv1.TaskEventType_TASK_EVENT_TYPE_CREATED,
	Started:        eventsv1.TaskEventType_TASK_EVENT_TYPE_STARTED,
	Completed:      eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED,
	Failed:         eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED,
	RetryScheduled: eventsv1.TaskEventType_TASK_EVENT_TYPE_RETRY_SCHEDULED,
	DeadLettered:   eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED,
	Requeued:       eventsv1.TaskEventType_TASK_EVENT_TYPE_REQUEUED,
	Abandoned:      eventsv1.TaskEventType_TASK_EVENT_TYPE_ABANDONED,
	LeaseExpired:   eventsv1.TaskEventType_TASK_EVENT_TYPE_LEASE_EXPIRED,
	Rejected:       eventsv1.TaskEventType_TASK_EVENT_TYPE_REJECTED,
	Waiting:        eventsv1.TaskEventType_TASK_EVENT_TYPE_WAITING,
	LeaseExtended:  eventsv1.TaskEventType_TASK_EVENT_TYPE_LEASE_EXTENDED,
}

// Proto is the wire type of t.
func (t Type) Proto() eventsv1.TaskEventType { return protoTypes[t] }

// Outcome reports whether an event of type t is also an outcome record: it
// ends an attempt (completed, failed, retry scheduled, dead-lettered),
// refuses an invocation (rejected) or says the attempt's result comes later
// (waiting). Those are what the services outside the dispatcher act on (the
// registry's counters, the workflow runner, task waits), so they read the
// outcomes topic, one small record a task, and not the changelog.
func (t Type) Outcome() bool {
	switch t {
	case Completed, Failed, RetryScheduled, DeadLettered, Rejected, Waiting:
		return true
	}
	return false
}

// TypeOf is the Type of a wire type; ok=false for one it does not know.
func TypeOf(p eventsv1.TaskEventType) (Type, bool) {
	for t, q := range protoTypes {
		if q == p {
			return t, true
		}
	}
	return 0, false
}

// Status maps a task state to its API status.
func Status(s store.Status) flov1.TaskStatus {
	switch s {
	case store.Queued:
		return flov1.TaskStatus_TASK_STATUS_QUEUED
	case store.Running:
		return flov1.TaskStatus_TASK_STATUS_RUNNING
	case store.Waiting:
		return flov1.TaskStatus_TASK_STATUS_WAITING
	case store.Completed:
		return flov1.TaskStatus_TASK_STATUS_COMPLETED
	case store.Failed:
		return flov1.TaskStatus_TASK_STATUS_FAILED
	case store.DeadLettered:
		return flov1.TaskStatus_TASK_STATUS_DEAD_LETTERED
	default:
		return flov1.TaskStatus_TASK_STATUS_UNSPECIFIED
	}
}

// MaxTextBytes caps each free-text field an event carries (a worker's error,
// an outcome), so that an event stays within kafka.RecordEnvelopeBytes of
// its result whatever a worker sent; the task keeps the text whole.
const MaxTextBytes = 16 << 10
