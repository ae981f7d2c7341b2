// Package taskevent turns task state changes into TaskEvent records for the
// outbox. Each record carries the task's own trace context in its headers, so
// consumers of flo.tasks.events continue the invoker's trace.
package taskevent

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/text"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// Topic is where task events go.
const Topic = "flo.tasks.events"

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

// Record encodes one event about c, which happened at at.
func Record(typ Type, c store.Change, at time.Time) (outbox.Record, error) {
	ev := &eventsv1.TaskEvent{
		EventId:    uuid.NewString(),
		Type:       protoTypes[typ],
		TaskId:     c.ID.String(),
		Namespace:  c.Namespace,
		Action:     c.Action,
		Status:     Status(c.Status),
		Attempt:    c.Attempt,
		WorkerId:   c.WorkerID,
		Outcome:    text.Clean(c.Outcome, MaxTextBytes),
		Error:      text.Clean(c.Error, MaxTextBytes),
		OccurredAt: timestamppb.New(at),
		CreatedAt:  timestamppb.New(c.CreatedAt),
		Origin:     c.Origin,
		// Only the workflow service reads results off the log; other
		// consumers read them from the dispatcher when they need them.
		NonRetryable: typ == Failed,
		TimedOut:     c.TimedOut,
		ErrorCode:    c.ErrorCode,
	}
	if c.Origin != "" && typ == Completed {
		// Whole: results are at most FLO_MAX_PAYLOAD_BYTES (the gateway
		// refuses larger ones), and producers are sized for that plus the
		// envelope (kafka.MaxRecordSize).
		ev.Result = c.Result
	}
	value, err := proto.Marshal(ev)
	if err != nil {
		return outbox.Record{}, fmt.Errorf("encode %s event of task %s: %w", ev.Type, c.ID, err)
	}
	headers := c.TraceContext
	if headers == nil {
		// Non-nil so the outbox does not substitute the context of whoever
		// wrote the event: the task's own trace is what consumers follow.
		headers = map[string]string{}
	}
	return outbox.Record{Topic: Topic, Key: []byte(ev.TaskId), Value: value, Headers: headers}, nil
}

// Builder collects the events of one transaction, and counts them for
// Counters.
type Builder struct {
	at      time.Time
	records []outbox.Record
	tallies map[tally]int64
	err     error
}

// NewBuilder returns a Builder stamping events with at.
func NewBuilder(at time.Time) *Builder { return &Builder{at: at, tallies: map[tally]int64{}} }

// Add appends an event about c; the first encoding error is kept for Write.
func (b *Builder) Add(typ Type, c store.Change) {
	if b.err != nil {
		return
	}
	r, err := Record(typ, c, b.at)
	if err != nil {
		b.err = err
		return
	}
	b.records = append(b.records, r)
	b.tallies[tallyOf(typ, c)]++
}

// Write writes the collected records to the outbox in tx; what names the
// events in the error.
func (b *Builder) Write(ctx context.Context, tx pgx.Tx, what string) error {
	if b.err != nil {
		return b.err
	}
	if err := outbox.Write(ctx, tx, b.records...); err != nil {
		return fmt.Errorf("write %s events: %w", what, err)
	}
	return nil
}

// Sweep runs one batch of a sweep that moves tasks on by itself (expired
// leases, passed async deadlines) in one transaction: take changes up to a
// batch of tasks, then record adds their events to b and does whatever else
// the transaction must, and the events are written as what. It returns the
// changes and the committed events, nil when there were none.
func Sweep(ctx context.Context, pool *pgxpool.Pool, what string, take func(pgx.Tx) ([]store.Change, error),
	record func(tx pgx.Tx, b *Builder, changes []store.Change) error) ([]store.Change, *Builder, error) {
	var (
		changes []store.Change
		events  *Builder
	)
	err := pg.InTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if changes, err = take(tx); err != nil || len(changes) == 0 {
			return err
		}
		events = NewBuilder(time.Now())
		if err := record(tx, events, changes); err != nil {
			return err
		}
		return events.Write(ctx, tx, what)
	})
	if err != nil || len(changes) == 0 {
		return nil, nil, err
	}
	return changes, events, nil
}
