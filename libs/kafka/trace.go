package kafka

import (
	"bytes"
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// propagator is fixed to W3C tracecontext + baggage rather than taken from
// the otel globals: the record format must not depend on whether a process
// happened to install a global propagator.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// InjectTrace writes the trace context of ctx into r's headers
// (traceparent, tracestate, baggage), replacing earlier values.
func InjectTrace(ctx context.Context, r *kgo.Record) {
	propagator.Inject(ctx, headerCarrier{r})
}

// ExtractTrace returns ctx carrying the remote span context found in r's
// headers, so spans started from it join the producer's trace.
func ExtractTrace(ctx context.Context, r *kgo.Record) context.Context {
	return propagator.Extract(ctx, headerCarrier{r})
}

// TraceHeaders returns the trace context of ctx as header name -> value, for
// records written before they reach a producer (the outbox).
func TraceHeaders(ctx context.Context) map[string]string {
	m := propagation.MapCarrier{}
	propagator.Inject(ctx, m)
	return m
}

// traceFields are the headers the propagator reads.
var traceFields = propagator.Fields()

// TraceMemo makes the trace contexts (TraceHeaders of ExtractTrace) of a
// sequence of records, and gives the last one made again to a record that
// carries the same trace headers as the record it was made of: the records
// of one batch (an InvokeMany) do. Holders of what it returns share the map
// and must not change it. It is not safe for concurrent use.
type TraceMemo struct {
	values [][]byte
	last   map[string]string
}

// Valid returns the trace context r's headers carry, nil when they carry
// no valid one.
func (m *TraceMemo) Valid(r *kgo.Record) map[string]string {
	if m.last != nil && m.same(r) {
		return m.last
	}
	ctx := ExtractTrace(context.Background(), r)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	m.last = TraceHeaders(ctx)
	m.values = m.values[:0]
	for _, f := range traceFields {
		m.values = append(m.values, bytes.Clone(headerValue(r, f)))
	}
	return m.last
}

// same reports whether r's trace headers are those last made into a trace
// context; an absent header is the same as an empty one, as the propagator
// reads them.
func (m *TraceMemo) same(r *kgo.Record) bool {
	for i, f := range traceFields {
		if !bytes.Equal(headerValue(r, f), m.values[i]) {
			return false
		}
	}
	return true
}

// headerValue is the value of r's first header named key, nil when it has
// none.
func headerValue(r *kgo.Record, key string) []byte {
	for _, h := range r.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

// ContextFromHeaders is ExtractTrace for headers held in a map.
func ContextFromHeaders(ctx context.Context, h map[string]string) context.Context {
	return propagator.Extract(ctx, propagation.MapCarrier(h))
}

// headerCarrier adapts record headers to the otel TextMapCarrier.
type headerCarrier struct{ r *kgo.Record }

func (c headerCarrier) Get(key string) string { return string(headerValue(c.r, key)) }

func (c headerCarrier) Set(key, value string) {
	for i, h := range c.r.Headers {
		if h.Key == key {
			c.r.Headers[i].Value = []byte(value)
			return
		}
	}
	c.r.Headers = append(c.r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c.r.Headers))
	for i, h := range c.r.Headers {
		keys[i] = h.Key
	}
	return keys
}
