package inbox_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/inbox"
	"github.com/razorbill/flo/libs/pg"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pg.Connect(ctx, harness.NewDatabase(t), "consumer", 4, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	migrations := fstest.MapFS{"0001_inbox.sql": {Data: []byte("-- +goose Up\n" + inbox.Migration)}}
	require.NoError(t, pg.Migrate(ctx, pool, "consumer", migrations))
	return pool
}

func claim(t *testing.T, pool *pgxpool.Pool, ids ...string) map[string]bool {
	t.Helper()
	var fresh map[string]bool
	require.NoError(t, pg.InTx(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		fresh, err = inbox.Claim(context.Background(), tx, ids)
		return err
	}))
	return fresh
}

func TestClaim(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	require.Equal(t, map[string]bool{"a": true, "b": true}, claim(t, pool, "a", "b", "a"))
	require.Empty(t, claim(t, pool, "a", "b"), "a second claim of the same ids returns none")
	require.Equal(t, map[string]bool{"c": true}, claim(t, pool, "b", "c"))
	require.Empty(t, claim(t, pool))
}

func TestClaimRolledBackIsFreshAgain(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	err := pg.InTx(ctx, pool, func(tx pgx.Tx) error {
		fresh, err := inbox.Claim(ctx, tx, []string{"x"})
		require.NoError(t, err)
		require.True(t, fresh["x"])
		return context.Canceled // the consumer's change failed
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, map[string]bool{"x": true}, claim(t, pool, "x"))
}
