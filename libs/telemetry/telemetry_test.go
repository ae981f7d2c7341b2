package telemetry_test

import (
	"context"
	"io"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/telemetry"
)

func TestSetupSharedAndShutdown(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	ctx := context.Background()

	first, err := telemetry.Setup(ctx, "gateway")
	require.NoError(t, err)
	second, err := telemetry.Setup(ctx, "dispatcher")
	require.NoError(t, err, "a second service in the same process")

	// Spans get real ids even without an exporter, so they reach logs.
	spanCtx, span := otel.Tracer("test").Start(ctx, "op")
	require.True(t, span.SpanContext().IsValid())
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(spanCtx, carrier)
	require.NotEmpty(t, carrier["traceparent"])
	span.End()

	counter, err := otel.Meter("test").Int64Counter("flo_test_things")
	require.NoError(t, err)
	counter.Add(ctx, 3)
	for _, tel := range []*telemetry.Telemetry{first, second} {
		rec := httptest.NewRecorder()
		tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		body, err := io.ReadAll(rec.Body)
		require.NoError(t, err)
		require.Contains(t, string(body), "flo_test_things_total")
		require.Contains(t, string(body), "go_goroutines")
	}

	require.NoError(t, first.Shutdown(ctx))
	require.NoError(t, first.Shutdown(ctx), "twice is fine")
	_, span = otel.Tracer("test").Start(ctx, "still works")
	require.True(t, span.SpanContext().IsValid(), "providers live while a user remains")
	span.End()
	require.NoError(t, second.Shutdown(ctx))

	third, err := telemetry.Setup(ctx, "again")
	require.NoError(t, err, "setting up after a full shutdown")
	require.NoError(t, third.Shutdown(ctx))
}

func TestSetupWithOTLPEndpoint(t *testing.T) {
	// The exporter connects lazily, so no collector is needed to set up.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	ctx := context.Background()
	tel, err := telemetry.Setup(ctx, "svc")
	require.NoError(t, err)
	_, span := otel.Tracer("test").Start(ctx, "op")
	span.End()
	shutdownCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_ = tel.Shutdown(shutdownCtx) // the export to nowhere may fail; it must not hang
}

// early is taken from the globals before any Setup, as package-level tracers
// are.
var early = otel.Tracer("early")

func TestSpanProcessorSeesEverySpanOfItsSetup(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	ctx := context.Background()
	// Twice: a tracer provider replaced after a full shutdown would leave
	// early bound to the first one.
	for i := range 2 {
		rec := tracetest.NewSpanRecorder()
		tel, err := telemetry.Setup(ctx, "svc", telemetry.WithSpanProcessor(rec))
		require.NoError(t, err)
		_, span := early.Start(ctx, "early op")
		span.End()
		_, span = otel.Tracer("late").Start(ctx, "late op")
		span.End()
		require.NoError(t, tel.Shutdown(ctx))
		_, span = early.Start(ctx, "after shutdown")
		span.End()

		var names []string
		for _, s := range rec.Ended() {
			names = append(names, s.Name())
		}
		require.Equal(t, []string{"early op", "late op"}, names, "setup %d", i+1)
	}
}

// While nothing records spans, a span under a parent is no span: its
// context is the parent's, so what is injected downstream names the
// caller's span and keeps its sampled flag. Once a processor is registered,
// the same call makes a real child span.
func TestSpansUnderAParentPassThroughWhileNothingRecords(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	ctx := context.Background()
	tel, err := telemetry.Setup(ctx, "svc")
	require.NoError(t, err)
	parent := propagation.MapCarrier{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	remote := otel.GetTextMapPropagator().Extract(ctx, parent)

	childCtx, child := otel.Tracer("test").Start(remote, "child")
	require.False(t, child.IsRecording())
	require.Equal(t, trace.SpanContextFromContext(remote), child.SpanContext())
	out := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(childCtx, out)
	require.Equal(t, parent["traceparent"], out["traceparent"])
	child.End()

	// A root is not made either, but it still gets ids of its own, for the
	// logs and for what goes on downstream, sampled as the SDK samples a
	// root; a span under it carries them too.
	rootCtx, root := otel.Tracer("test").Start(ctx, "root")
	require.False(t, root.IsRecording())
	require.True(t, root.SpanContext().IsValid())
	require.True(t, root.SpanContext().IsSampled())
	_, other := otel.Tracer("test").Start(ctx, "root")
	require.NotEqual(t, root.SpanContext().TraceID(), other.SpanContext().TraceID())
	require.NotEqual(t, root.SpanContext().SpanID(), other.SpanContext().SpanID())
	underCtx, under := otel.Tracer("test").Start(rootCtx, "under")
	require.Equal(t, root.SpanContext(), under.SpanContext())
	out = propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(underCtx, out)
	require.Equal(t, "00-"+root.SpanContext().TraceID().String()+"-"+root.SpanContext().SpanID().String()+"-01", out["traceparent"])
	under.End()
	root.End()

	// A recording span made before the last processor went (a request in
	// flight) is ended, not replaced: a span under it is not made, and
	// ending that does not end the parent.
	rec := tracetest.NewSpanRecorder()
	tel2, err := telemetry.Setup(ctx, "svc", telemetry.WithSpanProcessor(rec))
	require.NoError(t, err)
	liveCtx, live := otel.Tracer("test").Start(ctx, "live")
	require.True(t, live.IsRecording())
	require.NoError(t, tel2.Shutdown(ctx))
	_, notMade := otel.Tracer("test").Start(liveCtx, "under")
	require.Equal(t, live.SpanContext(), notMade.SpanContext())
	notMade.End()
	require.True(t, live.IsRecording(), "ending a span not made ended its parent")
	live.End()
	require.NoError(t, tel.Shutdown(ctx))

	rec = tracetest.NewSpanRecorder()
	tel, err = telemetry.Setup(ctx, "svc", telemetry.WithSpanProcessor(rec))
	require.NoError(t, err)
	_, child = otel.Tracer("test").Start(remote, "child")
	require.True(t, child.IsRecording())
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", child.SpanContext().TraceID().String())
	require.NotEqual(t, trace.SpanContextFromContext(remote).SpanID(), child.SpanContext().SpanID())
	child.End()
	require.NoError(t, tel.Shutdown(ctx))
	require.Len(t, rec.Ended(), 1)
	require.Equal(t, "b7ad6b7169203331", rec.Ended()[0].Parent().SpanID().String())
}
