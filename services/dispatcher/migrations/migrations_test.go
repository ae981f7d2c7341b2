package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/services/dispatcher/migrations"
)

// The outbox table must be the one the relay expects.
func TestOutboxMigrationsMatchLibrary(t *testing.T) {
	t.Parallel()
	require.NoError(t, outbox.CheckMigrations(migrations.FS, "0001_outbox.sql", "0004_outbox_batches.sql", "0005_outbox_dead.sql"))
}
