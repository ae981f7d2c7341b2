package taskevent

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/telemetry/telemetrytest"
)

func TestCountersCountEventsByAction(t *testing.T) {
	metrics := telemetrytest.New(t)
	counters, err := NewCounters(metrics.Meter("test"))
	require.NoError(t, err)
	ctx := context.Background()

	counters.CountEvents(ctx, Created, "ns", "a", "", 2)
	counters.CountEvents(ctx, Created, "ns", "b", "", 1)
	counters.CountEvents(ctx, LeaseExpired, "ns", "a", "", 1)
	counters.CountEvents(ctx, DeadLettered, "ns", "a", "", 1)
	// A rejected invocation may name anything: it is counted by reason only.
	counters.CountEvents(ctx, Rejected, "ns", "made-up", "target_not_found", 1)
	// A type without a counter counts nothing.
	counters.CountEvents(ctx, LeaseExtended, "ns", "a", "", 1)

	require.Equal(t, map[string]float64{
		"flo.tasks.invoked action=a,namespace=ns":        2,
		"flo.tasks.invoked action=b,namespace=ns":        1,
		"flo.tasks.leases.expired action=a,namespace=ns": 1,
		"flo.tasks.dead_lettered action=a,namespace=ns":  1,
		"flo.tasks.rejected reason=target_not_found":     1,
	}, metrics.Series())
}
