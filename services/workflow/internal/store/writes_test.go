package store_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
	"github.com/razorbill/flo/services/workflow/migrations"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// connect returns a pool of one connection on a migrated database, so a
// connection the transaction failed to hand back would stall the next one.
func connect(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pg.Connect(t.Context(), harness.NewDatabase(t), "workflow", 1, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pg.Migrate(t.Context(), pool, "workflow", migrations.FS))
	return pool
}

func newRun(id, key string) *store.Run {
	now := time.Now().Truncate(time.Microsecond)
	return &store.Run{
		Run: engine.Run{
			ID: id, Namespace: "ns", Workflow: "wf", Version: "1", Status: engine.StatusRunning,
			Input: []byte(`{}`), CreatedAt: now, UpdatedAt: now,
		},
		IdempotencyKey: key,
	}
}

// commit writes runs, a history event per run and an outbox record in one
// transaction.
func commit(ctx context.Context, pool *pgxpool.Pool, runs ...*store.Run) error {
	tx, err := pg.BeginBatch(ctx, pool)
	if err != nil {
		return err
	}
	defer tx.Close(ctx)
	var w store.Writes
	if err := w.InsertRuns(runs); err != nil {
		return err
	}
	var history []store.HistoryRow
	for _, r := range runs {
		history = append(history, store.HistoryRow{RunID: r.ID, Seq: 1, HistoryEvent: engine.HistoryEvent{Type: "WorkflowStarted", At: r.CreatedAt}})
	}
	w.AppendHistory(history)
	if err := w.WriteOutbox(ctx, []outbox.Record{{Topic: "t", Key: []byte(runs[0].ID)}}); err != nil {
		return err
	}
	return w.Commit(ctx, tx)
}

func count(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM `+table).Scan(&n))
	return n
}

func TestWritesCommitAllOrNothing(t *testing.T) {
	ctx := t.Context()
	pool := connect(t)
	require.NoError(t, commit(ctx, pool, newRun("0190d9c4-6b5e-7c3a-8f00-000000000001", "key")))

	// The second run's key is taken: the insert fails, and the history and
	// outbox rows queued with it must not land either.
	err := commit(ctx, pool, newRun("0190d9c4-6b5e-7c3a-8f00-000000000002", "key"))
	require.ErrorContains(t, err, "insert 1 runs", "the error names the failed write")
	require.True(t, store.IsUniqueViolation(err, store.IdempotencyIndex), "got %v", err)
	require.Equal(t, 1, count(t, pool, "runs"))
	require.Equal(t, 1, count(t, pool, "history"))
	require.Equal(t, 1, count(t, pool, "outbox"))

	// The pool's only connection came back out of the failed transaction.
	require.NoError(t, commit(ctx, pool, newRun("0190d9c4-6b5e-7c3a-8f00-000000000003", "other")))
	require.Equal(t, 2, count(t, pool, "runs"))
	require.Equal(t, 2, count(t, pool, "outbox"))
}
