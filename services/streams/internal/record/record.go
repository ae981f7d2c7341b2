package record

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// IsTraceHeader reports whether key is a log header that carries the W3C
// trace context of the append (traceparent, tracestate, baggage). Those are
// returned as a record's trace context, never as its headers, and callers may
// not set them.
func IsTraceHeader(key string) bool {
	switch key {
	case "traceparent", "tracestate", "baggage":
		return true
	}
	return false
}

// Record is one stream record read from the log.
type Record struct {
	ID         ID
	Partition  int32
	Offset     int64
	Key        string
	Payload    []byte
	Headers    map[string]string
	Trace      map[string]string
	AppendedAt time.Time
	// DeliveryCount is set on group reads: how many times the group has
	// handed the record out, this time included.
	DeliveryCount int
}

// MaxResponseBytes bounds the record bytes one read returns (a read always
// returns at least one record, however large), so a response stays well
// within what gRPC clients accept.
const MaxResponseBytes = 32 << 20

// Size is what a log record adds to a response.
func Size(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + 64
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return n
}

// IDOf is the id of a log record of a stream topic.
func IDOf(r *kgo.Record) ID { return NewID(r.Timestamp.UnixMilli(), r.Partition, r.Offset) }

// FromLog converts a record of a stream's topic. The log record is shared
// (it may sit in the read cache), so nothing of it is modified; the payload
// is shared, not copied.
func FromLog(r *kgo.Record) Record {
	rec := Record{
		ID:         IDOf(r),
		Partition:  r.Partition,
		Offset:     r.Offset,
		Key:        string(r.Key),
		Payload:    r.Value,
		AppendedAt: r.Timestamp,
	}
	for _, h := range r.Headers {
		if IsTraceHeader(h.Key) {
			if rec.Trace == nil {
				rec.Trace = make(map[string]string, 2)
			}
			rec.Trace[h.Key] = string(h.Value)
			continue
		}
		if rec.Headers == nil {
			rec.Headers = make(map[string]string, len(r.Headers))
		}
		rec.Headers[h.Key] = string(h.Value)
	}
	return rec
}
