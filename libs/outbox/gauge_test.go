package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/razorbill/flo/libs/telemetry/telemetrytest"
)

// Not parallel: the relay reports through the global meter provider, which
// this test replaces while it runs.
func TestRelayReportsBacklog(t *testing.T) {
	metrics := telemetrytest.Global(t)
	e := setup(t)
	ctx := context.Background()
	startRelay(t, e)
	e.broker.Close()
	write(t, e, ctx, values("m", 0, 7)...)

	schema := attribute.String("schema", "svc")
	require.Eventually(t, func() bool {
		rows, _ := metrics.Value("flo.outbox.backlog", schema)
		age, _ := metrics.Value("flo.outbox.oldest_age", schema)
		return rows == 7 && age > 0
	}, 20*time.Second, 50*time.Millisecond, "rows wait while the broker is down")

	require.NoError(t, e.broker.Restart())
	require.Eventually(t, func() bool {
		rows, okRows := metrics.Value("flo.outbox.backlog", schema)
		age, okAge := metrics.Value("flo.outbox.oldest_age", schema)
		return okRows && okAge && rows == 0 && age == 0
	}, 30*time.Second, 50*time.Millisecond, "published rows leave the backlog")
}
