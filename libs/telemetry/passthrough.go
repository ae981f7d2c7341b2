package telemetry

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"sync/atomic"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// registered counts the span processors registered in the process (the
// OTLP exporter, WithSpanProcessor): while it is zero no span goes anywhere.
var registered atomic.Int32

// Recording reports whether the spans this process makes go anywhere: an
// OTLP endpoint is configured or a span processor is registered. What only
// a recorded span shows (links, events) need not be gathered while it is
// false.
func Recording() bool { return registered.Load() > 0 }

// passthroughProvider is the process's global tracer provider. While
// nothing records spans, a span started under a valid parent is no span:
// the parent's context passes on unchanged, so the trace ids in logs and in
// the records and calls that go on stay those of the caller's trace (its
// sampled flag too, for processes downstream that do record), and the hot
// paths (a span per invocation, report and consumed batch) cost nothing. A
// span without a parent is no span either, but a context of new ids,
// sampled as the SDK's default sampler samples a root: every request still
// has a trace id for its logs and passes it on, without the cost of a span
// that goes nowhere. The options are not read (reading them costs what is
// saved), so trace.WithNewRoot under a parent passes the parent on too;
// nothing here uses it.
type passthroughProvider struct {
	embedded.TracerProvider
	sdk *sdktrace.TracerProvider
}

// Tracer returns the SDK's tracer of that name, behind the pass-through.
func (p *passthroughProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return &passthroughTracer{sdk: p.sdk.Tracer(name, opts...)}
}

type passthroughTracer struct {
	embedded.Tracer
	sdk trace.Tracer
}

// Start starts an SDK span, or, while nothing records spans, a span that
// does nothing: under a valid span context it carries that context (and is
// ctx's own span when that records nothing either), and without one it
// carries new ids.
func (t *passthroughTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if Recording() {
		return t.sdk.Start(ctx, name, opts...)
	}
	parent := trace.SpanFromContext(ctx)
	sc := parent.SpanContext()
	if sc.IsValid() && !parent.IsRecording() {
		// A parent that records nothing (a remote context, another span
		// not made) has nothing to end: ctx serves as it is.
		return ctx, parent
	}
	if !sc.IsValid() {
		sc = newRoot()
	}
	s := unmadeSpan{sc: sc}
	return trace.ContextWithSpan(ctx, s), s
}

// newRoot is the context of a root span not made. The ids need to be
// unique, not secret: math/rand/v2's generator is per thread and takes no
// lock, where the SDK's takes one per span.
func newRoot() trace.SpanContext {
	var tid trace.TraceID
	var sid trace.SpanID
	for !tid.IsValid() {
		binary.BigEndian.PutUint64(tid[:8], rand.Uint64())
		binary.BigEndian.PutUint64(tid[8:], rand.Uint64())
	}
	for !sid.IsValid() {
		binary.BigEndian.PutUint64(sid[:], rand.Uint64())
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
}

// unmadeSpan stands for a span not made: it carries a span context (its
// parent's, or a new root's) and ignores everything else (ending it must
// not end the parent).
type unmadeSpan struct {
	noop.Span
	sc trace.SpanContext
}

// SpanContext is the context the span carries.
func (s unmadeSpan) SpanContext() trace.SpanContext { return s.sc }
