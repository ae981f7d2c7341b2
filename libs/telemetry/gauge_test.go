package telemetry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/telemetry/telemetrytest"
)

func TestSnapshotLoadsOncePerMaxAge(t *testing.T) {
	clock := time.Unix(1000, 0)
	var loads int
	fail := false
	s := &snapshot[int]{maxAge: 5 * time.Second, now: func() time.Time { return clock }, load: func(ctx context.Context) (int, error) {
		_, hasDeadline := ctx.Deadline()
		require.True(t, hasDeadline, "a load is bounded")
		loads++
		if fail {
			return 0, errors.New("database down")
		}
		return loads * 10, nil
	}}
	ctx := context.Background()

	for range 3 {
		v, err := s.get(ctx)
		require.NoError(t, err)
		require.Equal(t, 10, v)
	}
	require.Equal(t, 1, loads, "reads within the max age share one load")

	clock = clock.Add(5 * time.Second)
	v, err := s.get(ctx)
	require.NoError(t, err)
	require.Equal(t, 20, v, "an old value is loaded again")

	fail = true
	clock = clock.Add(6 * time.Second)
	_, err = s.get(ctx)
	require.Error(t, err)
	_, err = s.get(ctx)
	require.Error(t, err, "a failure is reused too")
	require.Equal(t, 3, loads)
}

func TestGaugesReportUntilContextEnds(t *testing.T) {
	r := telemetrytest.New(t)
	meter := r.Meter("test")
	depth, err := meter.Int64ObservableGauge("flo.test.depth")
	require.NoError(t, err)
	var loads int
	g := NewGauges(meter, time.Hour, func(context.Context) (int64, error) {
		loads++
		return 7, nil
	}, func(v int64, o metric.Observer) { o.ObserveInt64(depth, v) }, depth)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	require.Eventually(t, func() bool {
		v, ok := r.Value("flo.test.depth")
		return ok && v == 7
	}, 5*time.Second, 10*time.Millisecond)
	_, _ = r.Value("flo.test.depth")
	require.Equal(t, 1, loads, "collections within the max age share one load")

	cancel()
	require.NoError(t, <-done)
	_, ok := r.Value("flo.test.depth")
	require.False(t, ok, "unregistered when its component stopped")
}
