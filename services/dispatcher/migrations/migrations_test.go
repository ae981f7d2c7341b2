package migrations_test

import (
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/services/dispatcher/migrations"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// The outbox table must be the one the relay expects.
func TestOutboxMigrationsMatchLibrary(t *testing.T) {
	t.Parallel()
	require.NoError(t, outbox.CheckMigrations(migrations.FS, "0001_outbox.sql", "0004_outbox_batches.sql", "0005_outbox_dead.sql"))
}

// The task view's migration goes down (the sweeps' indexes back, the view's
// columns and tables gone) and up again.
func TestTaskViewMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	pool, up, down := harness.MigrationSections(t, migrations.FS, "dispatcher", "0010_task_view.sql")

	// exists reports which of the view's objects and the sweeps' indexes
	// are there.
	exists := func() []bool {
		var live, offsets, owners, lease, waiting, partition bool
		require.NoError(t, pool.QueryRow(t.Context(), `
SELECT to_regclass('tasks_live_idx') IS NOT NULL, to_regclass('view_offsets') IS NOT NULL,
	to_regclass('partition_owners') IS NOT NULL, to_regclass('tasks_lease_idx') IS NOT NULL,
	to_regclass('tasks_waiting_idx') IS NOT NULL,
	EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'dispatcher' AND table_name = 'tasks' AND column_name = 'partition')`).
			Scan(&live, &offsets, &owners, &lease, &waiting, &partition))
		return []bool{live, offsets, owners, lease, waiting, partition}
	}
	// 0012 replaced the live index; goose takes it down first.
	require.Equal(t, []bool{false, true, true, false, false, true}, exists())
	src, err := fs.ReadFile(migrations.FS, "0012_task_cold_index.sql")
	require.NoError(t, err)
	_, later, _ := strings.Cut(string(src), "-- +goose Down")
	_, err = pool.Exec(t.Context(), later)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), down)
	require.NoError(t, err)
	require.Equal(t, []bool{false, false, false, true, true, false}, exists())
	_, err = pool.Exec(t.Context(), up)
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, true, false, false, true}, exists())
}

// The cold-task indexes, which replace the live index, go down (the live
// index back) and up again.
func TestColdIndexesMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	pool, up, down := harness.MigrationSections(t, migrations.FS, "dispatcher", "0012_task_cold_index.sql")
	exists := func() []bool {
		var ready, due, busy, live bool
		require.NoError(t, pool.QueryRow(t.Context(), `
SELECT to_regclass('tasks_cold_ready_idx') IS NOT NULL, to_regclass('tasks_cold_due_idx') IS NOT NULL,
	to_regclass('tasks_busy_idx') IS NOT NULL, to_regclass('tasks_live_idx') IS NOT NULL`).Scan(&ready, &due, &busy, &live))
		return []bool{ready, due, busy, live}
	}
	require.Equal(t, []bool{true, true, true, false}, exists())
	_, err := pool.Exec(t.Context(), down)
	require.NoError(t, err)
	require.Equal(t, []bool{false, false, false, true}, exists())
	_, err = pool.Exec(t.Context(), up)
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, true, false}, exists())
}

// The index of each queue's cold tasks goes down and up again.
func TestColdQueueIndexMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	requireDownAndUp(t, "0013_task_cold_queue_index.sql", "tasks_cold_queue_idx")
}

// The table of the view's partition count goes down and up again.
func TestViewLayoutMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	requireDownAndUp(t, "0014_view_layout.sql", "view_layout")
}

// requireDownAndUp checks that migration file's Up made relation and its
// Down removes it, and Up makes it again.
func requireDownAndUp(t *testing.T, file, relation string) {
	t.Helper()
	pool, up, down := harness.MigrationSections(t, migrations.FS, "dispatcher", file)
	exists := func() bool {
		var ok bool
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, relation).Scan(&ok))
		return ok
	}
	require.True(t, exists())
	_, err := pool.Exec(t.Context(), down)
	require.NoError(t, err)
	require.False(t, exists())
	_, err = pool.Exec(t.Context(), up)
	require.NoError(t, err)
	require.True(t, exists())
}
