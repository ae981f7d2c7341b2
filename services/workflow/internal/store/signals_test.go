package store_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// A backlog larger than MaxPendingSignals (stored before the runner refused
// signals past it) is loaded only up to the limit, oldest first, so an
// advance's memory stays bounded.
func TestLockRunsLoadsAtMostMaxPendingSignals(t *testing.T) {
	ctx := t.Context()
	pool := connect(t)
	const runID = "0190d9c4-6b5e-7c3a-8f00-0000000000aa"
	require.NoError(t, commit(ctx, pool, newRun(runID, "")))
	start := time.Now().Truncate(time.Microsecond)
	for i := range store.MaxPendingSignals + 5 {
		require.NoError(t, store.InsertSignal(ctx, pool, "ns", runID, engine.Signal{
			ID: uuid.NewString(), Type: "t", Payload: []byte(`{}`), ReceivedAt: start.Add(time.Duration(i) * time.Millisecond),
		}))
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	runs, sigs, err := store.LockRuns(ctx, tx, []string{runID}, false)
	require.NoError(t, err)
	require.Contains(t, runs, runID)
	require.Len(t, sigs[runID], store.MaxPendingSignals)
	require.True(t, sigs[runID][0].ReceivedAt.Equal(start), "oldest first")
	require.True(t, sigs[runID][store.MaxPendingSignals-1].ReceivedAt.Equal(start.Add(time.Duration(store.MaxPendingSignals-1)*time.Millisecond)))
}
