package view

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// Owner is a row of partition_owners: which replica owns a partition, and
// where it answers.
type Owner struct {
	Partition int32
	Replica   string
	Address   string
	// Member is the replica's consumer group member id when it took the
	// partition.
	Member    string
	UpdatedAt time.Time
}

// SetOwners records replica, at address and as group member, as the owner
// of partitions (on assignment); another replica's rows for them are taken
// over.
func SetOwners(ctx context.Context, db store.DB, replica, address, member string, partitions []int32) error {
	_, err := db.Exec(ctx, `
INSERT INTO partition_owners (partition, replica, address, member)
SELECT p, $2, $3, $4 FROM unnest($1::int[]) AS p
ON CONFLICT (partition) DO UPDATE SET replica = EXCLUDED.replica, address = EXCLUDED.address, member = EXCLUDED.member, updated_at = now()`,
		partitions, replica, address, member)
	if err != nil {
		return fmt.Errorf("set owner of partitions %v: %w", partitions, err)
	}
	return nil
}

// Owners lists every partition's owner, by partition.
func Owners(ctx context.Context, db store.DB) ([]Owner, error) {
	rows, err := db.Query(ctx, `SELECT partition, replica, address, member, updated_at FROM partition_owners ORDER BY partition`)
	if err != nil {
		return nil, fmt.Errorf("list partition owners: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Owner, error) {
		var o Owner
		err := r.Scan(&o.Partition, &o.Replica, &o.Address, &o.Member, &o.UpdatedAt)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("list partition owners: %w", err)
	}
	return out, nil
}
