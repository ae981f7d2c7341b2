package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/services/dispatcher/migrations"
)

// The outbox table must be the one the relay expects.
func TestOutboxMigrationMatchesLibrary(t *testing.T) {
	t.Parallel()
	b, err := migrations.FS.ReadFile("0001_outbox.sql")
	require.NoError(t, err)
	require.Contains(t, string(b), outbox.Migration)
	b, err = migrations.FS.ReadFile("0004_outbox_batches.sql")
	require.NoError(t, err)
	require.Contains(t, string(b), outbox.BatchMigration)
	require.Contains(t, string(b), outbox.BatchMigrationDown)
}
