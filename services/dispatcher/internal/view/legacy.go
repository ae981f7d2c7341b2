package view

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// AssignPartitions gives the live tasks written before log-first dispatch
// (migration 0010 left them in partition -1) the partition of their id, so
// the owner of that partition loads them at its rebuild. It returns how many
// it moved; once done it finds none.
func AssignPartitions(ctx context.Context, db store.DB, partitionOf func(id string) int32) (int, error) {
	rows, err := db.Query(ctx, `SELECT id FROM tasks WHERE partition = -1 AND state IN ('queued', 'running', 'waiting')`)
	if err != nil {
		return 0, fmt.Errorf("select tasks without a partition: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return 0, fmt.Errorf("select tasks without a partition: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	parts := make([]int32, len(ids))
	for i, id := range ids {
		parts[i] = partitionOf(id.String())
	}
	tag, err := db.Exec(ctx, `
UPDATE tasks t SET partition = u.partition
FROM unnest($1::uuid[], $2::int[]) AS u(id, partition)
WHERE t.id = u.id AND t.partition = -1`, ids, parts)
	if err != nil {
		return 0, fmt.Errorf("give tasks their partitions: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
