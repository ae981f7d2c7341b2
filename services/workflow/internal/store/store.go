// Package store holds every SQL statement of the workflow service and the row
// types they read and write. Functions take a DB so the same query runs on the
// pool or inside a caller's transaction; callers own transaction boundaries.
//
// Arrays of run ids are sent as text[] and cast to uuid[] in SQL: pgx has no
// binary encoding of a Go string as a uuid, and before falling back to text
// it builds an error message that prints the whole array, which costs more
// than the statement itself when a batch carries hundreds of ids.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// DB is what both *pgxpool.Pool and pgx.Tx offer.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// TimersChannel is the Postgres NOTIFY channel telling every replica that a
// timer falls due soon.
const TimersChannel = "flo_workflow_timers"

// ErrVersionExists is returned when a workflow version is created twice.
var ErrVersionExists = errors.New("workflow version already exists")

// IsRetryable reports whether err is a transaction conflict that succeeds
// when the transaction is simply run again: a deadlock (two transactions
// locking a parent and its child in opposite orders) or a serialization
// failure.
func IsRetryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// IsUniqueViolation reports whether err is a unique violation of the named
// constraint or index.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == constraint
}

// nullTime maps the zero time to NULL.
func nullTime(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}

// timeOrZero maps NULL to the zero time.
func timeOrZero(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time
}
