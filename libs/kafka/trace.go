package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
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

// ContextFromHeaders is ExtractTrace for headers held in a map.
func ContextFromHeaders(ctx context.Context, h map[string]string) context.Context {
	return propagator.Extract(ctx, propagation.MapCarrier(h))
}

// headerCarrier adapts record headers to the otel TextMapCarrier.
type headerCarrier struct{ r *kgo.Record }

func (c headerCarrier) Get(key string) string {
	for _, h := range c.r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

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
