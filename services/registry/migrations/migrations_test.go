package migrations_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/services/registry/migrations"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// The outbox tables must be the ones the library expects.
func TestLibraryTablesMatch(t *testing.T) {
	t.Parallel()
	require.NoError(t, outbox.CheckMigrations(migrations.FS, "0001_outbox.sql", "0003_outbox_batches.sql", "0004_outbox_dead.sql"))
}

// The tally offsets' migration goes down (processed_events back, with its
// index) and up again.
func TestTallyOffsetsMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	pool, up, down := harness.MigrationSections(t, migrations.FS, "registry", "0006_tally_offsets.sql")

	// exists reports which of tally_offsets, processed_events and its index
	// are there.
	exists := func() []bool {
		var offsets, processed, index bool
		require.NoError(t, pool.QueryRow(t.Context(), `
SELECT to_regclass('tally_offsets') IS NOT NULL, to_regclass('processed_events') IS NOT NULL,
	to_regclass('processed_events_processed_at_idx') IS NOT NULL`).Scan(&offsets, &processed, &index))
		return []bool{offsets, processed, index}
	}
	require.Equal(t, []bool{true, false, false}, exists())
	_, err := pool.Exec(t.Context(), down)
	require.NoError(t, err)
	require.Equal(t, []bool{false, true, true}, exists())
	_, err = pool.Exec(t.Context(), up)
	require.NoError(t, err)
	require.Equal(t, []bool{true, false, false}, exists())
}
