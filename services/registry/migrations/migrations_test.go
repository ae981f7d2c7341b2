package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/services/registry/migrations"
)

// The outbox tables must be the ones the library expects.
func TestLibraryTablesMatch(t *testing.T) {
	t.Parallel()
	require.NoError(t, outbox.CheckMigrations(migrations.FS, "0001_outbox.sql", "0003_outbox_batches.sql", "0004_outbox_dead.sql"))
}
