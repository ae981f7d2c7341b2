package taskevent

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/telemetry/telemetrytest"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

func TestCountersCountCommittedEventsByAction(t *testing.T) {
	metrics := telemetrytest.New(t)
	counters, err := NewCounters(metrics.Meter("test"))
	require.NoError(t, err)
	ctx := context.Background()

	change := func(action string) store.Change {
		return store.Change{ID: uuid.New(), Namespace: "ns", Action: action, Status: store.DeadLettered}
	}
	b := NewBuilder(time.Now())
	b.Add(Created, change("a"))
	b.Add(Created, change("a"))
	b.Add(Created, change("b"))
	b.Add(LeaseExpired, change("a"))
	b.Add(DeadLettered, change("a"))
	b.Add(Rejected, store.Change{ID: uuid.New(), Namespace: "ns", Action: "made-up", Outcome: "target_not_found"})
	counters.Count(ctx, b)
	counters.Count(ctx, nil)
	counters.Count(ctx, NewBuilder(time.Now()))

	require.Equal(t, map[string]float64{
		"flo.tasks.invoked action=a,namespace=ns":        2,
		"flo.tasks.invoked action=b,namespace=ns":        1,
		"flo.tasks.leases.expired action=a,namespace=ns": 1,
		"flo.tasks.dead_lettered action=a,namespace=ns":  1,
		"flo.tasks.rejected reason=target_not_found":     1,
	}, metrics.Series())
}
