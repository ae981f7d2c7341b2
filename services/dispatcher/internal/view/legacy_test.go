package view_test

import (
	"math"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/view"
)

// Live tasks from before log-first dispatch get their id's partition, so
// that partition's owner loads them; final ones stay where they are.
func TestAssignPartitionsToTasksFromBefore(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	ctx := t.Context()
	live, done := uuid.New(), uuid.New()
	for id, state := range map[uuid.UUID]string{live: "queued", done: "completed"} {
		_, err := db.Exec(ctx, `
INSERT INTO tasks (id, namespace, action, state, payload, max_attempts, timeout_ms, backoff_kind, backoff_initial_ms,
	backoff_max_ms, backoff_multiplier, created_at, run_at)
VALUES ($1, 'ns', 'a', $2, '\x7b7d', 3, 1000, 'constant', 10, 10, 1, now(), now())`, id, state)
		require.NoError(t, err)
	}
	partitionOf := func(id string) int32 { return kafka.PartitionOf(id, 4) }
	n, err := view.AssignPartitions(ctx, db, partitionOf)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	loaded, _ := loadLive(t, db, partitionOf(live.String()), engine.Limits{}, time.Now())
	require.Len(t, loaded, 1)
	require.Equal(t, live, loaded[0].ID)
	var part int32
	require.NoError(t, db.QueryRow(ctx, `SELECT partition FROM tasks WHERE id = $1`, done).Scan(&part))
	require.Equal(t, int32(-1), part, "final tasks are read by id, never loaded")
	_, viewed, err := view.Load(ctx, db, "ns", done)
	require.NoError(t, err)
	require.Equal(t, int64(math.MaxInt64), viewed, "no record changed it: the row is its last state")

	n, err = view.AssignPartitions(ctx, db, partitionOf)
	require.NoError(t, err)
	require.Zero(t, n, "done once")
}
