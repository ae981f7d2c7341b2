package probe_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/probe"
)

type pinger func(ctx context.Context) error

func (p pinger) Ping(ctx context.Context) error { return p(ctx) }

func TestChecks(t *testing.T) {
	t.Parallel()
	var stopping, consuming atomic.Bool
	dbDown := errors.New("connection refused")
	var db error
	ready := probe.All(
		probe.Unset(&stopping, "stopping"),
		probe.Set(&consuming, "consumer not running"),
		probe.Ping("database", pinger(func(ctx context.Context) error {
			_, ok := ctx.Deadline()
			require.True(t, ok, "a ping is bounded")
			return db
		}), time.Second),
	)
	ctx := context.Background()
	require.EqualError(t, ready(ctx), "consumer not running")
	consuming.Store(true)
	require.NoError(t, ready(ctx))
	db = dbDown
	require.EqualError(t, ready(ctx), "database: connection refused")
	require.ErrorIs(t, ready(ctx), dbDown)
	stopping.Store(true)
	require.EqualError(t, ready(ctx), "stopping", "the first check that fails says why")
}
