package store_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
func connect(t *testing.T) (pool *pgxpool.Pool, url string) {
	t.Helper()
	url = harness.NewDatabase(t)
	pool, err := pg.Connect(t.Context(), url, "workflow", 1, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pg.Migrate(t.Context(), pool, "workflow", migrations.FS))
	return pool, url
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
	tx, err := store.Begin(ctx, pool)
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
	return tx.Commit(ctx, &w)
}

func count(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM `+table).Scan(&n))
	return n
}

func TestTxHoldsLocksFromItsFirstStatementUntilCommit(t *testing.T) {
	ctx := t.Context()
	pool, url := connect(t)
	id := "0190d9c4-6b5e-7c3a-8f00-000000000001"
	require.NoError(t, commit(ctx, pool, newRun(id, "")))

	tx, err := store.Begin(ctx, pool)
	require.NoError(t, err)
	defer tx.Close(ctx)
	runs, _, err := store.LockRuns(ctx, tx, []string{id}, false)
	require.NoError(t, err)
	require.Contains(t, runs, id)

	// BEGIN went with the lock, so the lock outlives the statement.
	other, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { _ = other.Close(context.WithoutCancel(ctx)) }()
	_, err = other.Exec(ctx, `SELECT 1 FROM workflow.runs WHERE id = $1 FOR UPDATE NOWAIT`, id)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "the run is locked by the open transaction")

	run := runs[id]
	run.Status = engine.StatusCompleted
	var w store.Writes
	require.NoError(t, w.UpdateRuns([]*store.Run{run}))
	require.NoError(t, tx.Commit(ctx, &w))

	_, err = other.Exec(ctx, `SELECT 1 FROM workflow.runs WHERE id = $1 FOR UPDATE NOWAIT`, id)
	require.NoError(t, err, "commit released the lock")
	var status string
	require.NoError(t, other.QueryRow(ctx, `SELECT status FROM workflow.runs WHERE id = $1`, id).Scan(&status))
	require.Equal(t, "completed", status)
}

func TestTxCommitsAllOrNothing(t *testing.T) {
	ctx := t.Context()
	pool, _ := connect(t)
	require.NoError(t, commit(ctx, pool, newRun("0190d9c4-6b5e-7c3a-8f00-000000000001", "key")))

	// The second run's key is taken: the insert fails, and the history and
	// outbox rows queued with it must not land either.
	err := commit(ctx, pool, newRun("0190d9c4-6b5e-7c3a-8f00-000000000002", "key"))
	require.Error(t, err)
	require.True(t, store.IsUniqueViolation(err, store.IdempotencyIndex), "got %v", err)
	require.Equal(t, 1, count(t, pool, "runs"))
	require.Equal(t, 1, count(t, pool, "history"))
	require.Equal(t, 1, count(t, pool, "outbox"))

	// The pool's only connection came back out of the failed transaction.
	require.NoError(t, commit(ctx, pool, newRun("0190d9c4-6b5e-7c3a-8f00-000000000003", "other")))
	require.Equal(t, 2, count(t, pool, "runs"))
	require.Equal(t, 2, count(t, pool, "outbox"))
}

func TestTxClosedWithoutCommitRollsBack(t *testing.T) {
	ctx := t.Context()
	pool, _ := connect(t)
	tx, err := store.Begin(ctx, pool)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO signals (id, run_id, type, payload, received_at) VALUES (gen_random_uuid(), gen_random_uuid(), 'x', '', now())`)
	require.NoError(t, err)
	tx.Close(ctx)
	require.Equal(t, 0, count(t, pool, "signals"))
}
