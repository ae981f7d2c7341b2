package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/services/workflow/internal/engine"
)

// RunCount is how many runs of one workflow have a status.
type RunCount struct {
	Namespace, Workflow string
	Status              engine.Status
	Runs                int64
}

// CountRuns counts runs by namespace, workflow and status in one grouped
// statement; combinations without runs are not returned. It reads the whole
// runs table, so callers cache what it returns.
func CountRuns(ctx context.Context, db DB) ([]RunCount, error) {
	rows, err := db.Query(ctx, `
		SELECT namespace, workflow, status, count(*)
		FROM runs
		GROUP BY namespace, workflow, status
		ORDER BY namespace, workflow, status`)
	if err != nil {
		return nil, fmt.Errorf("count runs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RunCount, error) {
		var c RunCount
		err := r.Scan(&c.Namespace, &c.Workflow, &c.Status, &c.Runs)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count runs: %w", err)
	}
	return out, nil
}
