package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/pg"
)

func TestLockXactSerialisesTransactionsUntilCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := connect(t, harness.NewDatabase(t), "locks")

	first, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer first.Rollback(ctx)
	require.NoError(t, pg.LockXact(ctx, first, "quota/ns-a"))

	// Another name is free at once.
	require.NoError(t, pg.InTx(ctx, pool, func(tx pgx.Tx) error { return pg.LockXact(ctx, tx, "quota/ns-b") }))

	second := make(chan error, 1)
	go func() {
		second <- pg.InTx(ctx, pool, func(tx pgx.Tx) error { return pg.LockXact(ctx, tx, "quota/ns-a") })
	}()
	// The second transaction waits on the advisory lock while the first holds it.
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting))
		return waiting == 1
	}, 10*time.Second, 10*time.Millisecond)
	select {
	case err := <-second:
		t.Fatalf("second transaction took the lock while the first held it: %v", err)
	default:
	}
	require.NoError(t, first.Commit(ctx))
	require.NoError(t, <-second)
}
