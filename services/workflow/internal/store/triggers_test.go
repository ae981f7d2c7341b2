package store_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/workflow/internal/store"
)

func TestTriggerRecordsAreClaimedOnceAndReleased(t *testing.T) {
	t.Parallel()
	pool := connect(t)
	ctx := t.Context()
	recs := func(ids ...string) store.TriggerRecords {
		return store.TriggerRecords{Namespace: "default", Workflow: "order-processor", Stream: "prod/orders", IDs: ids}
	}
	run1, run2, run3 := uuid.NewString(), uuid.NewString(), uuid.NewString()

	claimed, err := store.ClaimTriggerRecords(ctx, pool, recs("5-0", "5-1"), run1)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"5-0": true, "5-1": true}, claimed)

	// Regrouped with a new record: only the new one is claimed.
	claimed, err = store.ClaimTriggerRecords(ctx, pool, recs("5-1", "5-2"), run2)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"5-2": true}, claimed)
	owner, err := store.TriggerRun(ctx, pool, "default", "order-processor", "prod/orders", "5-1")
	require.NoError(t, err)
	require.Equal(t, run1, owner)

	// Another workflow reading the same stream claims its own.
	other := recs("5-0")
	other.Workflow = "audit"
	claimed, err = store.ClaimTriggerRecords(ctx, pool, other, run3)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"5-0": true}, claimed)

	// A run that did not start after all gives its records back.
	require.NoError(t, store.ReleaseTriggerRecords(ctx, pool, run2))
	claimed, err = store.ClaimTriggerRecords(ctx, pool, recs("5-2"), run3)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"5-2": true}, claimed)
}
