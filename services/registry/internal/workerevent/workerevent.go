// Package workerevent turns worker registry changes into WorkerEvent records
// for the outbox, keyed by namespace/worker_id so one worker's events stay in
// order on one partition.
package workerevent

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/outbox"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/registry/internal/store"
)

// Type is what happened to a worker.
type Type = eventsv1.WorkerEventType

// Event types.
const (
	Registered    = eventsv1.WorkerEventType_WORKER_EVENT_TYPE_REGISTERED
	StatusChanged = eventsv1.WorkerEventType_WORKER_EVENT_TYPE_STATUS_CHANGED
	Deregistered  = eventsv1.WorkerEventType_WORKER_EVENT_TYPE_DEREGISTERED
)

// Status maps a worker status to its API value; "" (none) is unspecified.
func Status(s store.Status) flov1.WorkerStatus {
	switch s {
	case store.Active:
		return flov1.WorkerStatus_WORKER_STATUS_ACTIVE
	case store.Idle:
		return flov1.WorkerStatus_WORKER_STATUS_IDLE
	case store.Draining:
		return flov1.WorkerStatus_WORKER_STATUS_DRAINING
	case store.Unhealthy:
		return flov1.WorkerStatus_WORKER_STATUS_UNHEALTHY
	default:
		return flov1.WorkerStatus_WORKER_STATUS_UNSPECIFIED
	}
}

// Key is the record key of a worker's events.
func Key(namespace, workerID string) []byte { return []byte(namespace + "/" + workerID) }

// Encode returns the wire form of an event about c, which happened at at.
// For Registered, c.From is the status of the record it replaced, if any; for
// Deregistered, c.To is empty.
func Encode(typ Type, c store.Change, eventID string, at time.Time) ([]byte, error) {
	ev := &eventsv1.WorkerEvent{
		EventId:        eventID,
		Type:           typ,
		Namespace:      c.Namespace,
		WorkerId:       c.WorkerID,
		Status:         Status(c.To),
		PreviousStatus: Status(c.From),
		OccurredAt:     timestamppb.New(at),
	}
	b, err := proto.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode %s event of worker %s/%s: %w", typ, c.Namespace, c.WorkerID, err)
	}
	return b, nil
}

// Record returns the outbox record of an event about c. Its headers are left
// nil so the outbox stamps the trace context of the call that caused it.
func Record(typ Type, c store.Change, at time.Time) (outbox.Record, error) {
	value, err := Encode(typ, c, uuid.NewString(), at)
	if err != nil {
		return outbox.Record{}, err
	}
	return outbox.Record{Topic: kafka.WorkerEventsTopic, Key: Key(c.Namespace, c.WorkerID), Value: value}, nil
}
