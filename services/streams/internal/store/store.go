// Package store holds every SQL statement of the streams service and the row
// types they read and write. Functions take a DB so the same query runs on
// the pool or inside a caller's transaction; callers own transaction
// boundaries. Errors come back through pg.MapError, so callers match
// pg.ErrNotFound and pg.ErrConflict.
package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/pg"
)

// DB is what both *pgxpool.Pool and pgx.Tx offer.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Stream is a row of streams.
type Stream struct {
	ID             int64
	Namespace      string
	Name           string
	Partitions     int32
	RetentionMS    int64
	RetentionBytes int64
	CreatedAt      time.Time
}

// Topic is the log topic holding the stream's records. It is named by the
// row id, which is never reused, so a stream created again under an old name
// starts empty.
func (s Stream) Topic() string { return kafka.StreamTopicPrefix + strconv.FormatInt(s.ID, 10) }

const streamCols = `s.id, s.namespace, s.name, s.partitions, s.retention_ms, s.retention_bytes, s.created_at`

func scanStream(row pgx.Row, extra ...any) (Stream, error) {
	var s Stream
	dest := append([]any{&s.ID, &s.Namespace, &s.Name, &s.Partitions, &s.RetentionMS, &s.RetentionBytes, &s.CreatedAt}, extra...)
	err := row.Scan(dest...)
	return s, err
}

// CountStreams counts a namespace's streams.
func CountStreams(ctx context.Context, db DB, namespace string) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM streams WHERE namespace = $1`, namespace).Scan(&n); err != nil {
		return 0, fmt.Errorf("count streams in %s: %w", namespace, err)
	}
	return n, nil
}

// InsertStream stores a new stream and returns it with its id and creation
// time; an existing name is pg.ErrConflict.
func InsertStream(ctx context.Context, db DB, s Stream) (Stream, error) {
	row := db.QueryRow(ctx, `
		INSERT INTO streams AS s (namespace, name, partitions, retention_ms, retention_bytes)
		VALUES ($1, $2, $3, $4, $5)
		RETURNING `+streamCols,
		s.Namespace, s.Name, s.Partitions, s.RetentionMS, s.RetentionBytes)
	out, err := scanStream(row)
	if err != nil {
		return Stream{}, fmt.Errorf("insert stream %s/%s: %w", s.Namespace, s.Name, pg.MapError(err))
	}
	return out, nil
}

// GetStream reads a stream by name.
func GetStream(ctx context.Context, db DB, namespace, name string) (Stream, error) {
	row := db.QueryRow(ctx, `SELECT `+streamCols+` FROM streams s WHERE s.namespace = $1 AND s.name = $2`, namespace, name)
	s, err := scanStream(row)
	if err != nil {
		return Stream{}, fmt.Errorf("get stream %s/%s: %w", namespace, name, pg.MapError(err))
	}
	return s, nil
}

// ListStreams lists up to limit of a namespace's streams by name, those
// named after after.
func ListStreams(ctx context.Context, db DB, namespace, after string, limit int) ([]Stream, error) {
	rows, err := db.Query(ctx, `SELECT `+streamCols+` FROM streams s WHERE s.namespace = $1 AND s.name > $2 ORDER BY s.name LIMIT $3`,
		namespace, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list streams of %s: %w", namespace, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Stream, error) { return scanStream(r) })
	if err != nil {
		return nil, fmt.Errorf("list streams of %s: %w", namespace, err)
	}
	return out, nil
}

// DeleteStream deletes a stream with its groups, cursors and pending ranges,
// and records its topic in dropped_topics, so the topic is deleted even if
// the caller crashes before deleting it.
func DeleteStream(ctx context.Context, db DB, namespace, name string) (Stream, error) {
	row := db.QueryRow(ctx, `
		WITH gone AS (
			DELETE FROM streams s WHERE s.namespace = $1 AND s.name = $2
			RETURNING `+streamCols+`
		), dropped AS (
			INSERT INTO dropped_topics (topic)
			SELECT $3 || id FROM gone
			ON CONFLICT (topic) DO NOTHING
		)
		SELECT id, namespace, name, partitions, retention_ms, retention_bytes, created_at FROM gone`,
		namespace, name, kafka.StreamTopicPrefix)
	s, err := scanStream(row)
	if err != nil {
		return Stream{}, fmt.Errorf("delete stream %s/%s: %w", namespace, name, pg.MapError(err))
	}
	return s, nil
}

// DroppedTopics lists up to limit topics of deleted streams, oldest first.
func DroppedTopics(ctx context.Context, db DB, limit int) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT topic FROM dropped_topics ORDER BY dropped_at LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list dropped topics: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list dropped topics: %w", err)
	}
	return out, nil
}

// ForgetDroppedTopics removes topics the broker has deleted.
func ForgetDroppedTopics(ctx context.Context, db DB, topics []string) error {
	if _, err := db.Exec(ctx, `DELETE FROM dropped_topics WHERE topic = ANY($1)`, topics); err != nil {
		return fmt.Errorf("forget dropped topics: %w", err)
	}
	return nil
}
