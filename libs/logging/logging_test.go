package logging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/logging"
)

func TestLoggerAddsServiceAndTrace(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := logging.New(&buf, "INFO", "dispatcher")
	require.NoError(t, err)

	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0a, 0x0b},
		SpanID:     trace.SpanID{0x0c},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	log.With("component", "relay").InfoContext(ctx, "published", "n", 3)
	log.Debug("hidden")
	log.WithGroup("g").Info("plain", "k", "v")

	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	require.Len(t, lines, 2, "debug is below the level")
	var first, second map[string]any
	require.NoError(t, json.Unmarshal(lines[0], &first))
	require.NoError(t, json.Unmarshal(lines[1], &second))
	require.Equal(t, "dispatcher", first["service"])
	require.Equal(t, "relay", first["component"])
	require.Equal(t, "published", first["msg"])
	require.Equal(t, sc.TraceID().String(), first["trace_id"])
	require.Equal(t, sc.SpanID().String(), first["span_id"])
	require.Equal(t, "dispatcher", second["service"])
	require.NotContains(t, second, "trace_id", "no span, no trace id")
}

func TestBadLevel(t *testing.T) {
	t.Parallel()
	_, err := logging.New(&bytes.Buffer{}, "loud", "x")
	require.Error(t, err)
}
