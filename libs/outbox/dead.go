package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Dead is a record the log refused for good, as outbox_dead holds it.
type Dead struct {
	ID int64
	// OutboxID is the outbox row the record was written in.
	OutboxID int64
	Topic    string
	Key      []byte
	Value    []byte
	Headers  map[string]string
	// Error is why the log refused it.
	Error     string
	WrittenAt time.Time
	DeadAt    time.Time
}

// DB runs the statements of ListDead and Requeue: a pool, a connection or a
// transaction.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ListDead returns up to limit records of schema's outbox_dead, oldest
// first.
func ListDead(ctx context.Context, db DB, schema string, limit int) ([]Dead, error) {
	table := pgx.Identifier{schema, "outbox_dead"}.Sanitize()
	rows, err := db.Query(ctx, `SELECT id, outbox_id, topic, key, value, headers, error, written_at, dead_at
		FROM `+table+` ORDER BY id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Dead, error) {
		var d Dead
		err := row.Scan(&d.ID, &d.OutboxID, &d.Topic, &d.Key, &d.Value, &d.Headers, &d.Error, &d.WrittenAt, &d.DeadAt)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", table, err)
	}
	return out, nil
}

// Requeue moves the records ids of schema's outbox_dead back into its
// outbox, a row each in id order, for the service's relay to publish once
// the cause is fixed (a larger FLO_MAX_PAYLOAD_BYTES, a topic that accepts
// the record). It returns how many it moved; ids not in the table are
// skipped.
func Requeue(ctx context.Context, db DB, schema string, ids []int64) (int64, error) {
	dead := pgx.Identifier{schema, "outbox_dead"}.Sanitize()
	tag, err := db.Exec(ctx, `WITH moved AS (DELETE FROM `+dead+` WHERE id = ANY($1) RETURNING id, topic, key, value, headers)
		INSERT INTO `+pgx.Identifier{schema, "outbox"}.Sanitize()+` (topic, key, value, headers)
		SELECT ARRAY[topic], ARRAY[key], ARRAY[value], jsonb_build_array(headers) FROM moved ORDER BY id`, ids)
	if err != nil {
		return 0, fmt.Errorf("requeue from %s: %w", dead, err)
	}
	return tag.RowsAffected(), nil
}
