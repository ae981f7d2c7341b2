package harness

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/pg"
)

// MigrationSections opens a fresh database migrated by migrations into
// schema and returns a pool on it with the Up and Down sections of the
// migration file name, each plain statements as goose runs them: a test
// runs down and up again on the migrated schema.
func MigrationSections(tb testing.TB, migrations fs.FS, schema, name string) (pool *pgxpool.Pool, up, down string) {
	tb.Helper()
	pool, err := pg.Open(tb.Context(), NewDatabase(tb), schema, 2, migrations, nil)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	src, err := fs.ReadFile(migrations, name)
	require.NoError(tb, err)
	up, down, ok := strings.Cut(string(src), "-- +goose Down")
	require.True(tb, ok, "%s has no -- +goose Down section", name)
	return pool, up, down
}
