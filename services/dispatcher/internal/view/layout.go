package view

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// Layout returns the partition count the view's rows are keyed by, 0 when
// none is recorded yet (a view no replica has run on).
func Layout(ctx context.Context, db store.DB) (int32, error) {
	var n int32
	err := db.QueryRow(ctx, `SELECT partitions FROM view_layout`).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the view's partition count: %w", err)
	}
	return n, nil
}

// RequireLayout returns an error wrapping ErrRekeyed when the view is
// keyed by another partition count than n: a replica of n must not take
// over a partition of it.
func RequireLayout(ctx context.Context, db store.DB, n int32) error {
	recorded, err := Layout(ctx, db)
	if err != nil {
		return err
	}
	return keyedBy(n, recorded)
}

// keyedBy is nil when states keyed by n partitions fit a view recorded as
// keyed by recorded (0: none recorded yet, which any count fits), and an
// error wrapping ErrRekeyed otherwise.
func keyedBy(n, recorded int32) error {
	if recorded == 0 || recorded == n {
		return nil
	}
	return fmt.Errorf("keyed by %d partitions, and the view by %d: %w", n, recorded, ErrRekeyed)
}

// AdoptLayout records n as the view's partition count unless one is
// recorded, and returns the one recorded. Of two replicas that start on an
// empty view at once, the second reads the first's.
func AdoptLayout(ctx context.Context, db store.DB, n int32) (int32, error) {
	if _, err := db.Exec(ctx, `INSERT INTO view_layout (partitions) VALUES ($1) ON CONFLICT (one) DO NOTHING`, n); err != nil {
		return 0, fmt.Errorf("record the view's partition count: %w", err)
	}
	return Layout(ctx, db)
}

// RecordLayout records n as the partition count the view's rows are keyed
// by, in tx (a transaction holds the row until it ends) or on its own.
func RecordLayout(ctx context.Context, db store.DB, n int32) error {
	if _, err := db.Exec(ctx, `
INSERT INTO view_layout (partitions) VALUES ($1)
ON CONFLICT (one) DO UPDATE SET partitions = EXCLUDED.partitions, updated_at = now()`, n); err != nil {
		return fmt.Errorf("record the view's partition count: %w", err)
	}
	return nil
}

// rekeyChunk bounds the rows one statement of Rekey moves.
const rekeyChunk = 10_000

// Rekey keys the view by n partitions, in tx: every task row whose id falls
// in another partition of n (partitionOf) moves there, and the count is
// recorded. A moved row's view_offset is reset: it was an offset of its old
// partition's log, and the states that follow are written at offsets of
// its new one, which would compare as older. Rows from before log-first
// dispatch (partition -1) stay where they are. It returns how many moved.
//
// The count is recorded first, so the transaction holds its row throughout:
// a materializer's write that took it before (ErrRekeyed) has committed when
// the rows are read, and is moved with them; one that comes after waits for
// the commit and then refuses to write.
func Rekey(ctx context.Context, tx pgx.Tx, n int32, partitionOf func(id string) int32) (int, error) {
	if err := RecordLayout(ctx, tx, n); err != nil {
		return 0, err
	}
	rows, err := tx.Query(ctx, `SELECT id, partition FROM tasks WHERE partition >= 0`)
	if err != nil {
		return 0, fmt.Errorf("read task partitions: %w", err)
	}
	var (
		ids   []uuid.UUID
		parts []int32
		id    uuid.UUID
		was   int32
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &was}, func() error {
		if p := partitionOf(id.String()); p != was {
			ids = append(ids, id)
			parts = append(parts, p)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("read task partitions: %w", err)
	}
	for start := 0; start < len(ids); start += rekeyChunk {
		end := min(start+rekeyChunk, len(ids))
		if _, err := tx.Exec(ctx, `
UPDATE tasks t SET partition = u.partition, view_offset = -1
FROM unnest($1::uuid[], $2::int[]) AS u(id, partition)
WHERE t.id = u.id`, ids[start:end], parts[start:end]); err != nil {
			return 0, fmt.Errorf("move tasks to their partitions: %w", err)
		}
	}
	return len(ids), nil
}
