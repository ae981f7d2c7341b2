package pg_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/pg"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

var migrations = fstest.MapFS{
	"0001_items.sql": {Data: []byte(`-- +goose Up
CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL UNIQUE);
-- +goose Down
DROP TABLE items;
`)},
	"0002_counter.sql": {Data: []byte(`-- +goose Up
CREATE TABLE applied (n int);
INSERT INTO applied VALUES (1);
-- +goose Down
DROP TABLE applied;
`)},
}

func connect(t *testing.T, url, schema string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pg.Connect(ctx, url, schema, 4, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := harness.NewDatabase(t)
	pool := connect(t, url, "svc")

	require.NoError(t, pg.Migrate(ctx, pool, "svc", migrations))
	require.NoError(t, pg.Migrate(ctx, pool, "svc", migrations), "a second run is a no-op")

	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM svc.applied`).Scan(&n))
	require.Equal(t, 1, n, "each migration ran once")
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(version_id) FROM svc.goose_db_version`).Scan(&n))
	require.Equal(t, 2, n)
	var public bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('items', 'goose_db_version'))`).Scan(&public))
	require.False(t, public, "nothing lands in public")

	// The pool's unqualified names resolve in the schema.
	_, err := pool.Exec(ctx, `INSERT INTO items VALUES (1, 'a')`)
	require.NoError(t, err)
}

func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := harness.NewDatabase(t)
	pools := []*pgxpool.Pool{connect(t, url, "conc"), connect(t, url, "conc")}

	var wg sync.WaitGroup
	errs := make([]error, len(pools))
	for i, p := range pools {
		wg.Go(func() { errs[i] = pg.Migrate(ctx, p, "conc", migrations) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, pools[0].QueryRow(ctx, `SELECT count(*) FROM conc.applied`).Scan(&n))
	require.Equal(t, 1, n)
}

func TestMigrateSchemasIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := harness.NewDatabase(t)
	a, b := connect(t, url, "alpha"), connect(t, url, "beta")
	require.NoError(t, pg.Migrate(ctx, a, "alpha", migrations))
	require.NoError(t, pg.Migrate(ctx, b, "beta", migrations))
	_, err := a.Exec(ctx, `INSERT INTO items VALUES (1, 'in alpha')`)
	require.NoError(t, err)
	var n int
	require.NoError(t, b.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n))
	require.Zero(t, n)
}

func TestMigrateBadSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := connect(t, harness.NewDatabase(t), "bad")
	bad := fstest.MapFS{"0001_bad.sql": {Data: []byte("-- +goose Up\nCREATE TABLE broken (;\n")}}
	require.Error(t, pg.Migrate(ctx, pool, "bad", bad))
}

func TestInTxAndMapError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := connect(t, harness.NewDatabase(t), "tx")
	require.NoError(t, pg.Migrate(ctx, pool, "tx", migrations))

	require.NoError(t, pg.InTx(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO items VALUES (1, 'kept')`)
		return err
	}))
	boom := errors.New("boom")
	err := pg.InTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO items VALUES (2, 'dropped')`); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n))
	require.Equal(t, 1, n, "the failed transaction rolled back")

	_, err = pool.Exec(ctx, `INSERT INTO items VALUES (3, 'kept')`)
	require.ErrorIs(t, pg.MapError(err), pg.ErrConflict)
	var name string
	err = pg.MapError(pool.QueryRow(ctx, `SELECT name FROM items WHERE id = 42`).Scan(&name))
	require.ErrorIs(t, err, pg.ErrNotFound)
	require.ErrorIs(t, err, pgx.ErrNoRows)
	require.NoError(t, pg.MapError(nil))
	require.Equal(t, boom, pg.MapError(boom))
}

func TestConnectGivesUpWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := pg.Connect(ctx, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1", "x", 1, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// A transaction whose process stops talking mid-way (paused, as a zombie
// replica is) holds its row locks no longer than its bound: Postgres ends
// it, and the writer waiting on the same row goes on. A statement running
// past the bound is cancelled.
func TestBoundTxEndsAPausedTransaction(t *testing.T) {
	t.Parallel()
	pool := connect(t, harness.NewDatabase(t), "bound")
	ctx := t.Context()
	require.NoError(t, pg.Migrate(ctx, pool, "bound", migrations))

	paused, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = paused.Rollback(context.WithoutCancel(ctx)) }()
	require.NoError(t, pg.BoundTx(ctx, paused, 300*time.Millisecond))
	_, err = paused.Exec(ctx, `INSERT INTO items VALUES (1, 'paused')`)
	require.NoError(t, err)

	// This insert waits for the paused transaction's row lock, until
	// Postgres ends that transaction.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = pool.Exec(wctx, `INSERT INTO items VALUES (1, 'waiting') ON CONFLICT (id) DO NOTHING`)
	require.NoError(t, err, "the paused transaction's lock was held past its bound")
	var name string
	require.NoError(t, pool.QueryRow(ctx, `SELECT name FROM items WHERE id = 1`).Scan(&name))
	require.Equal(t, "waiting", name)
	require.Error(t, paused.Commit(ctx), "the paused transaction outlived its bound")

	err = pg.InTx(ctx, pool, func(tx pgx.Tx) error {
		if err := pg.BoundTx(ctx, tx, 200*time.Millisecond); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
		return err
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "57014", pgErr.Code, "a statement past the bound is cancelled")
}
