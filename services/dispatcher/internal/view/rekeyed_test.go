package view_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/dispatcher/internal/view"
)

// toFive is a partitionOf of the test's new count: every task falls in
// partition 5.
func toFive(string) int32 { return 5 }

// requireRow checks where the view keeps task id and in which state.
func requireRow(t *testing.T, pool *pgxpool.Pool, id uuid.UUID, partition int32, offset int64, state string) {
	t.Helper()
	var gotPartition int32
	var gotOffset int64
	var gotState string
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT partition, view_offset, state FROM tasks WHERE id = $1`, id).
		Scan(&gotPartition, &gotOffset, &gotState))
	require.Equal(t, []any{partition, offset, state}, []any{gotPartition, gotOffset, gotState})
}

// keyedByFour is a view keyed by four partitions and a materializer of
// states keyed by as many.
func keyedByFour(t *testing.T) (*pgxpool.Pool, *view.Materializer) {
	t.Helper()
	pool := openDB(t)
	_, err := view.AdoptLayout(t.Context(), pool, 4)
	require.NoError(t, err)
	m, _ := newMaterializer(t, pool, nil)
	return pool, m
}

// A replica paused through `dispatcher repartition` wakes with states keyed
// by the old count: its materializer writes none of them, and Run ends
// instead of retrying, while what it wrote before the change moved with
// the rest of the view.
func TestAWriterOfTheOldPartitionCountWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, m := keyedByFour(t)
	before := queued("ns")
	m.Add(view.Entry{Partition: 1, Offset: 0, CmdOffset: 0, Task: before})
	require.NoError(t, m.Flush(ctx))
	requireRow(t, pool, before.ID, 1, 0, "queued")

	require.NoError(t, pg.InTx(ctx, pool, func(tx pgx.Tx) error {
		moved, err := view.Rekey(ctx, tx, 8, toFive)
		if err == nil {
			require.Equal(t, 1, moved)
		}
		return err
	}))

	after := queued("ns")
	m.Add(view.Entry{Partition: 1, Offset: 1, CmdOffset: 1, Task: after},
		view.Entry{Partition: 1, Offset: 2, CmdOffset: 2, Task: running(before)})
	require.ErrorIs(t, m.Flush(ctx), view.ErrRekeyed)
	found, err := view.Existing(ctx, pool, []uuid.UUID{after.ID})
	require.NoError(t, err)
	require.Empty(t, found, "a task of the old count was written")
	requireRow(t, pool, before.ID, 5, -1, "queued")
	requireOffsets(t, pool, 1, 1, 0)

	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, view.ErrRekeyed)
	case <-time.After(10 * time.Second):
		t.Fatal("Run kept retrying a write of the old partition count")
	}
}

// A write that comes while the repartition's transaction is open waits for
// it, and then refuses: it never lands a row keyed by the old count behind
// the move.
func TestAWriteDuringARepartitionWaitsAndRefuses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, m := keyedByFour(t)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = view.Rekey(ctx, tx, 8, toFive)
	require.NoError(t, err)

	task := queued("ns")
	m.Add(view.Entry{Partition: 2, Offset: 0, CmdOffset: 0, Task: task})
	done := make(chan error, 1)
	go func() { done <- m.Flush(ctx) }()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
		return waiting == 1
	}, 10*time.Second, 10*time.Millisecond, "the write did not wait for the repartition")
	require.NoError(t, tx.Commit(ctx))

	require.ErrorIs(t, <-done, view.ErrRekeyed)
	found, err := view.Existing(ctx, pool, []uuid.UUID{task.ID})
	require.NoError(t, err)
	require.Empty(t, found, "a task of the old count was written")
	var recorded int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM view_offsets`).Scan(&recorded))
	require.Zero(t, recorded, "offsets of the old count were written")
}
