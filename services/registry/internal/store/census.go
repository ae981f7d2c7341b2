package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// StatusCount is how many workers of one namespace and type have a status.
type StatusCount struct {
	Namespace string
	Type      Type
	Status    Status
	Workers   int64
}

// CountWorkers counts workers by namespace, type and status in one
// statement; combinations without workers are not returned. The table holds
// one row per live worker (bounded per namespace), so the scan stays small.
func CountWorkers(ctx context.Context, db DB) ([]StatusCount, error) {
	rows, err := db.Query(ctx, `
		SELECT namespace, worker_type, status, count(*)
		FROM workers
		GROUP BY namespace, worker_type, status
		ORDER BY namespace, worker_type, status`)
	if err != nil {
		return nil, fmt.Errorf("count workers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StatusCount, error) {
		var c StatusCount
		err := r.Scan(&c.Namespace, &c.Type, &c.Status, &c.Workers)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count workers: %w", err)
	}
	return out, nil
}
