package flo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// StreamContext is what a stream handler receives: one record of the stream and the context
// to handle it in. Returning nil from the handler acks the record; returning an error (or
// panicking) nacks it, and the group hands it out again.
type StreamContext struct {
	ctx       context.Context
	record    *flov1.StreamRecord
	payload   []byte
	stream    string
	group     string
	consumer  string
	namespace string
}

func newStreamContext(ctx context.Context, w *StreamWorker, rec *flov1.StreamRecord) *StreamContext {
	return &StreamContext{
		ctx:       ctx,
		record:    rec,
		payload:   recordPayload(rec),
		stream:    w.opts.Stream,
		group:     w.opts.Group,
		consumer:  w.opts.Consumer,
		namespace: w.client.namespace,
	}
}

// Context returns the context for handling this record. It carries the record's trace span
// and ends when the worker's MessageTimeout passes, when the record is nacked; it is not
// cancelled when the worker is asked to stop, because a stopping worker lets its handlers
// finish.
func (s *StreamContext) Context() context.Context { return s.ctx }

// Into decodes the JSON payload into v. An empty payload leaves v as it is.
func (s *StreamContext) Into(v any) error {
	if len(s.payload) == 0 {
		return nil
	}
	if err := json.Unmarshal(s.payload, v); err != nil {
		return fmt.Errorf("decode payload of record %s: %w", s.record.GetId(), err)
	}
	return nil
}

// Payload returns the record's payload as it was appended. The slice must not be modified.
func (s *StreamContext) Payload() []byte { return s.payload }

// StreamID returns the record's id in its stream, "<milliseconds>-<sequence>".
func (s *StreamContext) StreamID() string { return s.record.GetId() }

// Headers returns the headers the record was appended with. The map must not be modified.
func (s *StreamContext) Headers() map[string]string { return s.record.GetHeaders() }

// Key returns the partition key the record was appended with, if any.
func (s *StreamContext) Key() string { return s.record.GetKey() }

// AppendedAt returns when the record was appended.
func (s *StreamContext) AppendedAt() time.Time { return timeFromProto(s.record.GetAppendedAt()) }

// DeliveryCount returns how many times the group has handed the record out, this time
// included: 1 the first time, more after nacks and timeouts.
func (s *StreamContext) DeliveryCount() int { return int(s.record.GetDeliveryCount()) }

// Stream returns the name of the stream the record belongs to.
func (s *StreamContext) Stream() string { return s.stream }

// Group returns the consumer group the worker reads as.
func (s *StreamContext) Group() string { return s.group }

// Consumer returns the worker's consumer name within its group.
func (s *StreamContext) Consumer() string { return s.consumer }

// Namespace returns the namespace of the stream.
func (s *StreamContext) Namespace() string { return s.namespace }
