package pg_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/pg"
)

// batchPool returns a pool of one connection with a table of unique names,
// so a connection a transaction failed to hand back, or handed back inside
// a transaction, would stall or spoil the next one.
func batchPool(t *testing.T) (pool *pgxpool.Pool, url string) {
	t.Helper()
	url = harness.NewDatabase(t)
	pool, err := pg.Connect(t.Context(), url, "", 1, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(t.Context(), `CREATE TABLE names (name text PRIMARY KEY)`)
	require.NoError(t, err)
	return pool, url
}

// insert is a batch that inserts names.
func insert(names ...string) *pgx.Batch {
	var b pgx.Batch
	for _, name := range names {
		b.Queue(`INSERT INTO names (name) VALUES ($1)`, name)
	}
	return &b
}

// send sends b in tx and reads all its results.
func send(ctx context.Context, tx *pg.BatchTx, b *pgx.Batch) error {
	return tx.SendBatch(ctx, b).Close()
}

// names returns the committed names starting with prefix.
func names(t *testing.T, pool *pgxpool.Pool, prefix string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT name FROM names WHERE left(name, 1) = $1 ORDER BY name`, prefix)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}

func TestInBatchTx(t *testing.T) {
	t.Parallel()
	pool, _ := batchPool(t)
	ctx := t.Context()
	// Each case writes names starting with its prefix.
	tests := []struct {
		name    string
		prefix  string
		fn      func(*pg.BatchTx) error
		wantErr string
		kept    []string
	}{
		{name: "two batches commit", prefix: "a", fn: func(tx *pg.BatchTx) error {
			if err := send(ctx, tx, insert("a1")); err != nil {
				return err
			}
			return tx.Commit(ctx, insert("a2"))
		}, kept: []string{"a1", "a2"}},
		{name: "a commit alone begins too", prefix: "b", fn: func(tx *pg.BatchTx) error {
			return tx.Commit(ctx, insert("b1"))
		}, kept: []string{"b1"}},
		{name: "a failing statement in the last batch rolls back the first", prefix: "c", fn: func(tx *pg.BatchTx) error {
			if err := send(ctx, tx, insert("c1")); err != nil {
				return err
			}
			return tx.Commit(ctx, insert("c2", "c1"))
		}, wantErr: "duplicate key"},
		{name: "a failing statement's error leads with its label", prefix: "d", fn: func(tx *pg.BatchTx) error {
			return tx.Commit(ctx, insert("d1", "d2", "d1"), "first", "second", "third")
		}, wantErr: "third: ERROR: duplicate key"},
		{name: "a commit after a failed statement reports the rollback", prefix: "e", fn: func(tx *pg.BatchTx) error {
			if err := send(ctx, tx, insert("e1", "e1")); err == nil {
				return errors.New("a duplicate insert succeeded")
			}
			return tx.Commit(ctx, &pgx.Batch{})
		}, wantErr: pgx.ErrTxCommitRollback.Error()},
		{name: "an error of fn rolls back", prefix: "f", fn: func(tx *pg.BatchTx) error {
			if err := send(ctx, tx, insert("f1")); err != nil {
				return err
			}
			return context.Canceled
		}, wantErr: context.Canceled.Error()},
		{name: "a transaction left open rolls back", prefix: "g", fn: func(tx *pg.BatchTx) error {
			return send(ctx, tx, insert("g1"))
		}, wantErr: "left open"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := pg.InBatchTx(ctx, pool, tt.fn)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.ElementsMatch(t, tt.kept, names(t, pool, tt.prefix))
		})
	}
	// The pool's one connection went back idle: a transaction left open on
	// it would hold z1 uncommitted.
	require.NoError(t, pg.InBatchTx(ctx, pool, func(tx *pg.BatchTx) error { return tx.Commit(ctx, insert("z1")) }))
	require.Equal(t, []string{"z1"}, names(t, pool, "z"))
}

func TestBatchTxHoldsLocksFromItsFirstStatementUntilCommit(t *testing.T) {
	t.Parallel()
	pool, url := batchPool(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `INSERT INTO names VALUES ('a')`)
	require.NoError(t, err)

	tx, err := pg.BeginBatch(ctx, pool)
	require.NoError(t, err)
	defer tx.Close(ctx)
	var name string
	require.NoError(t, tx.QueryRow(ctx, `SELECT name FROM names WHERE name = 'a' FOR UPDATE`).Scan(&name))
	require.Equal(t, "a", name)

	// BEGIN went with the lock, so the lock outlives the statement.
	other, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { _ = other.Close(context.WithoutCancel(ctx)) }()
	_, err = other.Exec(ctx, `SELECT 1 FROM names WHERE name = 'a' FOR UPDATE NOWAIT`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "the row is locked by the open transaction")

	// Reads after the first one run in the same transaction.
	rows, err := tx.Query(ctx, `SELECT name FROM names FOR UPDATE`)
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, all)

	var b pgx.Batch
	b.Queue(`UPDATE names SET name = 'b' WHERE name = 'a'`)
	require.NoError(t, tx.Commit(ctx, &b, "rename"))

	_, err = other.Exec(ctx, `SELECT 1 FROM names WHERE name = 'b' FOR UPDATE NOWAIT`)
	require.NoError(t, err, "commit released the lock")
	var renamed string
	require.NoError(t, other.QueryRow(ctx, `SELECT name FROM names`).Scan(&renamed))
	require.Equal(t, "b", renamed)
}

func TestBatchTxClosedWithoutCommitRollsBack(t *testing.T) {
	t.Parallel()
	pool, _ := batchPool(t)
	ctx := t.Context()
	tx, err := pg.BeginBatch(ctx, pool)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO names VALUES ('a1')`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO names VALUES ('a2')`)
	require.NoError(t, err)
	tx.Close(ctx)
	require.Empty(t, names(t, pool, "a"))

	// The pool's one connection came back out of the transaction.
	require.NoError(t, pg.InBatchTx(ctx, pool, func(tx *pg.BatchTx) error { return tx.Commit(ctx, insert("a3")) }))
	require.Equal(t, []string{"a3"}, names(t, pool, "a"))
}
