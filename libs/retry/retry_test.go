package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/retry"
)

var fast = retry.Policy{Initial: time.Millisecond, Max: 4 * time.Millisecond}

func TestDoRetriesUntilSuccess(t *testing.T) {
	calls := 0
	var waits []time.Duration
	err := retry.Do(context.Background(), fast, func() error {
		calls++
		if calls < 4 {
			return errors.New("not yet")
		}
		return nil
	}, func(_ error, attempt int, next time.Duration) {
		require.Equal(t, len(waits)+1, attempt)
		waits = append(waits, next)
	})
	require.NoError(t, err)
	require.Equal(t, 4, calls)
	require.Len(t, waits, 3)
	for _, w := range waits {
		require.LessOrEqual(t, w, time.Duration(float64(fast.Max)*(1+retry.Jitter)))
	}
}

func TestDoStopsOnPermanentTriesAndContext(t *testing.T) {
	bad := errors.New("bad input")
	calls := 0
	err := retry.Do(context.Background(), fast, func() error { calls++; return retry.Permanent(bad) }, nil)
	require.ErrorIs(t, err, bad)
	require.Equal(t, 1, calls)

	calls = 0
	p := fast
	p.Tries = 3
	err = retry.Do(context.Background(), p, func() error { calls++; return bad }, nil)
	require.ErrorIs(t, err, bad)
	require.Equal(t, 3, calls)

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err = retry.Do(ctx, fast, func() error {
		calls++
		if calls == 2 {
			cancel()
		}
		return bad
	}, nil)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 2, calls)
}

func TestBackoffGrowsToCeilingAndResets(t *testing.T) {
	b := retry.Policy{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond}.Backoff()
	var last time.Duration
	for range 10 {
		last = b.NextBackOff()
	}
	require.InDelta(t, float64(40*time.Millisecond), float64(last), float64(40*time.Millisecond)*retry.Jitter)
	b.Reset()
	require.InDelta(t, float64(10*time.Millisecond), float64(b.NextBackOff()), float64(10*time.Millisecond)*retry.Jitter)
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, retry.Sleep(ctx, time.Hour))
	require.True(t, retry.Sleep(context.Background(), time.Millisecond))
}
