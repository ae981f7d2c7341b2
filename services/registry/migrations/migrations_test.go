package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/inbox"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/services/registry/migrations"
)

// The outbox and inbox tables must be the ones the libraries expect.
func TestLibraryTablesMatch(t *testing.T) {
	t.Parallel()
	b, err := migrations.FS.ReadFile("0001_outbox.sql")
	require.NoError(t, err)
	require.Contains(t, string(b), outbox.Migration)
	require.Contains(t, string(b), inbox.Migration)
	b, err = migrations.FS.ReadFile("0003_outbox_batches.sql")
	require.NoError(t, err)
	require.Contains(t, string(b), outbox.BatchMigration)
	require.Contains(t, string(b), outbox.BatchMigrationDown)
}
