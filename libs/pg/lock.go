package pg

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs a statement: a pgx.Tx or a BatchTx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// LockXact takes the transaction-scoped advisory lock named name and holds it
// until the transaction tx ends. Transactions that count rows and then add
// one (a quota) take the same name first, so no two of them count at once
// and neither can pass a limit the other has just reached.
func LockXact(ctx context.Context, tx Execer, name string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey(name)); err != nil {
		return fmt.Errorf("lock %s: %w", name, err)
	}
	return nil
}
