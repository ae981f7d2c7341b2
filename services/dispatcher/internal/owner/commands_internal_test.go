package owner

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/telemetry"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
)

// While nothing records spans, a command's trace context goes on the task as
// the invoker sent it, so the worker's handler joins the invoker's trace.
func TestAnInvocationKeepsItsInvokersTraceContext(t *testing.T) {
	id := uuid.New()
	value, err := (&eventsv1.InvokeTask{TaskId: id.String(), Namespace: "ns", Action: "a"}).MarshalVT()
	require.NoError(t, err)
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	inv, err := decodeInvocation(&kgo.Record{Value: value, Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte(parent)}}}, &kafka.TraceMemo{})
	require.NoError(t, err)
	require.Equal(t, id, inv.TaskID)
	require.Equal(t, parent, inv.TraceContext["traceparent"])
}

// A command without a trace context starts a trace of its own, so the
// worker's handler and the task's records still share one.
// Not parallel: it installs the process's tracer provider.
func TestAnInvocationWithoutTraceContextStartsOne(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	tel, err := telemetry.Setup(t.Context(), "test")
	require.NoError(t, err)
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	traces := &kafka.TraceMemo{}
	seen := map[string]bool{}
	for range 2 {
		value, err := (&eventsv1.InvokeTask{TaskId: uuid.NewString(), Namespace: "ns", Action: "a"}).MarshalVT()
		require.NoError(t, err)
		inv, err := decodeInvocation(&kgo.Record{Value: value}, traces)
		require.NoError(t, err)
		parent := inv.TraceContext["traceparent"]
		require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-0[0-3]$`, parent)
		require.False(t, seen[parent], "each command starts its own trace")
		seen[parent] = true
	}
}
