package telemetry

import (
	"context"
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
// span without a parent is made as before, so every request still has a
// trace id for its logs. The options are not read (reading them costs what
// is saved), so trace.WithNewRoot under a parent passes the parent on too;
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

// Start starts an SDK span, or, while nothing records spans and ctx has a
// valid span context, returns ctx with that context as a span that does
// nothing (ctx itself when its span records nothing either).
func (t *passthroughTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !Recording() {
		parent := trace.SpanFromContext(ctx)
		if sc := parent.SpanContext(); sc.IsValid() {
			// A parent that records nothing (a remote context, another
			// span not made) has nothing to end: ctx serves as it is.
			if !parent.IsRecording() {
				return ctx, parent
			}
			s := parentSpan{sc: sc}
			return trace.ContextWithSpan(ctx, s), s
		}
	}
	return t.sdk.Start(ctx, name, opts...)
}

// parentSpan stands for a span not made: it carries its parent's context
// and ignores everything else (ending it must not end the parent).
type parentSpan struct {
	noop.Span
	sc trace.SpanContext
}

// SpanContext is the parent's.
func (s parentSpan) SpanContext() trace.SpanContext { return s.sc }
