package action

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// source is the truth the cache asks, with a call counter.
type source struct {
	enabled map[string]bool
	err     error
	calls   int
}

func (s *source) lookup(_ context.Context, _, name string) (bool, error) {
	s.calls++
	if s.err != nil {
		return false, s.err
	}
	e, ok := s.enabled[name]
	if !ok {
		return false, ErrNotFound
	}
	return e, nil
}

func TestCacheReusesAnswersForTheTTL(t *testing.T) {
	src := &source{enabled: map[string]bool{"on": true, "off": false}}
	now := time.Unix(1000, 0)
	c := NewCache(src.lookup, time.Second)
	c.now = func() time.Time { return now }
	ctx := context.Background()

	require.NoError(t, c.CheckInvocable(ctx, "ns", "on"))
	require.NoError(t, c.CheckInvocable(ctx, "ns", "on"))
	require.Equal(t, 1, src.calls)
	require.ErrorIs(t, c.CheckInvocable(ctx, "ns", "off"), ErrDisabled)
	require.ErrorIs(t, c.CheckInvocable(ctx, "ns", "missing"), ErrNotFound)
	require.ErrorIs(t, c.CheckInvocable(ctx, "ns", "missing"), ErrNotFound)
	require.Equal(t, 4, src.calls, "unknown actions are asked about every time")

	src.enabled["on"] = false
	require.NoError(t, c.CheckInvocable(ctx, "ns", "on"), "still cached")
	now = now.Add(time.Second)
	require.ErrorIs(t, c.CheckInvocable(ctx, "ns", "on"), ErrDisabled, "expired")

	src.enabled["on"] = true
	c.Forget("ns", "on")
	require.NoError(t, c.CheckInvocable(ctx, "ns", "on"), "forgotten")
}

func TestCacheFallsBackToExpiredAnswersWhenTheSourceFails(t *testing.T) {
	src := &source{enabled: map[string]bool{"on": true}}
	now := time.Unix(1000, 0)
	c := NewCache(src.lookup, time.Second)
	c.now = func() time.Time { return now }
	ctx := context.Background()

	require.NoError(t, c.CheckInvocable(ctx, "ns", "on"))
	now = now.Add(time.Hour)
	src.err = errors.New("dispatcher unavailable")
	require.NoError(t, c.CheckInvocable(ctx, "ns", "on"))
	err := c.CheckInvocable(ctx, "ns", "never-seen")
	require.ErrorIs(t, err, src.err)
}
