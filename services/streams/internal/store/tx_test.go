package store_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/streams/internal/store"
	"github.com/razorbill/flo/services/streams/migrations"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pg.Connect(t.Context(), harness.NewDatabase(t), "streams", 2, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pg.Migrate(t.Context(), pool, "streams", migrations.FS))
	return pool
}

// insert is a batch that records topics as dropped, a table with no
// foreign keys to satisfy.
func insert(topics ...string) *pgx.Batch {
	var b pgx.Batch
	for _, topic := range topics {
		b.Queue(`INSERT INTO dropped_topics (topic) VALUES ($1)`, topic)
	}
	return &b
}

func send(ctx context.Context, tx *store.BatchTx, b *pgx.Batch) error {
	res, err := tx.Send(ctx, b)
	if err != nil {
		return err
	}
	return res.Close()
}

func TestBatchTx(t *testing.T) {
	pool := newPool(t)
	ctx := t.Context()
	// Each case writes topics starting with its prefix.
	tests := []struct {
		name    string
		prefix  string
		fn      func(*store.BatchTx) error
		wantErr string
		kept    []string
	}{
		{name: "two batches commit", prefix: "a", fn: func(tx *store.BatchTx) error {
			if err := send(ctx, tx, insert("a1")); err != nil {
				return err
			}
			return tx.Commit(ctx, insert("a2"))
		}, kept: []string{"a1", "a2"}},
		{name: "a commit alone begins too", prefix: "b", fn: func(tx *store.BatchTx) error {
			return tx.Commit(ctx, insert("b1"))
		}, kept: []string{"b1"}},
		{name: "a failing statement in the last batch rolls back the first", prefix: "c", fn: func(tx *store.BatchTx) error {
			if err := send(ctx, tx, insert("c1")); err != nil {
				return err
			}
			return tx.Commit(ctx, insert("c2", "c1"))
		}, wantErr: "duplicate key"},
		{name: "an error of fn rolls back", prefix: "d", fn: func(tx *store.BatchTx) error {
			if err := send(ctx, tx, insert("d1")); err != nil {
				return err
			}
			return context.Canceled
		}, wantErr: context.Canceled.Error()},
		{name: "a transaction left open rolls back", prefix: "e", fn: func(tx *store.BatchTx) error {
			return send(ctx, tx, insert("e1"))
		}, wantErr: "left open"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := store.InBatchTx(ctx, pool, tt.fn)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			rows, err := pool.Query(ctx, `SELECT topic FROM dropped_topics WHERE left(topic, 1) = $1 ORDER BY topic`, tt.prefix)
			require.NoError(t, err)
			kept, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.ElementsMatch(t, tt.kept, kept)
		})
	}
	// The pool's connections went back idle: a transaction left open on one
	// would hold z1 uncommitted.
	for range 3 {
		require.NoError(t, store.InBatchTx(ctx, pool, func(tx *store.BatchTx) error { return tx.Commit(ctx, insert()) }))
	}
}
