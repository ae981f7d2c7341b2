// Package pg holds the Postgres plumbing every service shares: a pool bound to
// the service's schema, embedded goose migrations, the transaction helpers
// (InTx, and BatchTx for transactions that send BEGIN and COMMIT along with
// their statements) and one mapping from driver errors to domain errors.
package pg

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/razorbill/flo/libs/retry"
)

// ErrNotFound is returned (wrapped) when a row that must exist does not.
var ErrNotFound = errors.New("not found")

// ErrConflict is returned (wrapped) when a write collides with existing data.
var ErrConflict = errors.New("conflict")

// Connect opens a pgx pool whose connections use search_path=<schema>, so a
// service's unqualified table names resolve in its own schema. It retries
// until the database answers or ctx ends, logging each failed try, because
// services often start before their database is up.
func Connect(ctx context.Context, url, schema string, maxConns int32, log *slog.Logger) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	}
	var (
		pool    *pgxpool.Pool
		lastErr error
	)
	err = retry.Do(ctx, connectRetry, func() error {
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			if err = p.Ping(ctx); err == nil {
				pool = p
				return nil
			}
			p.Close()
		}
		lastErr = err
		return err
	}, func(err error, attempt int, next time.Duration) {
		if log != nil {
			log.WarnContext(ctx, "database not reachable yet", "attempt", attempt, "retry_in", next, "error", err)
		}
	})
	switch {
	case err == nil:
		return pool, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("connect to database: %w (last error: %v)", ctx.Err(), lastErr)
	}
	return nil, fmt.Errorf("connect to database: %w", err)
}

// connectRetry is how Connect waits for a database that is not up yet.
var connectRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// Open is Connect then Migrate: a service's pool with its schema up to date.
// On failure nothing stays open.
func Open(ctx context.Context, url, schema string, maxConns int32, migrations fs.FS, log *slog.Logger) (*pgxpool.Pool, error) {
	pool, err := Connect(ctx, url, schema, maxConns, log)
	if err != nil {
		return nil, err
	}
	if err := Migrate(ctx, pool, schema, migrations); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// Migrate creates schema if missing and applies the goose migrations found at
// the root of migrations (files NNNN_name.sql) with search_path=<schema>, so
// unqualified names in them land in the schema. The version table is
// <schema>.goose_db_version. Concurrent callers (replicas starting together)
// are serialised by a Postgres advisory lock per schema; the ones that come
// second find nothing left to do.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string, migrations fs.FS) error {
	cfg := pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	cfg.MinConns = 0
	cfg.MaxConns = 4
	mpool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("migrate %s: open pool: %w", schema, err)
	}
	defer mpool.Close()
	db := stdlib.OpenDBFromPool(mpool)
	defer db.Close()

	// A blocking advisory lock (no polling) serialises whole runs per
	// schema, including CREATE SCHEMA, which races on pg_namespace when two
	// sessions run it at once.
	conn, err := mpool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", schema, err)
	}
	defer conn.Release()
	lockID := lockKey("flo.migrate:" + schema)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockID); err != nil {
		return fmt.Errorf("migrate %s: lock: %w", schema, err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockID)
	}()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("migrate %s: create schema: %w", schema, err)
	}

	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockKey("flo.goose:" + schema)))
	if err != nil {
		return fmt.Errorf("migrate %s: %w", schema, err)
	}
	store, err := database.NewStore(database.DialectPostgres, schema+".goose_db_version")
	if err != nil {
		return fmt.Errorf("migrate %s: %w", schema, err)
	}
	provider, err := goose.NewProvider(goose.DialectCustom, db, migrations,
		goose.WithStore(store),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", schema, err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", schema, err)
	}
	return nil
}

// lockKey derives a stable advisory lock key from a name.
func lockKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}

// InTx runs fn in a transaction and commits when fn returns nil; otherwise it
// rolls back and returns fn's error unchanged, so callers can match domain
// errors with errors.Is.
func InTx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return InTxWith(ctx, pool, pgx.TxOptions{}, fn)
}

// InTxWith is InTx with the transaction's options (isolation, read only).
func InTxWith(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	tx, err := pool.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	return nil
}

// BoundTx limits, for the rest of tx, both how long one of its statements
// may run and how long it may sit idle between statements to d. Without it a
// process paused mid-transaction (SIGSTOP, a frozen VM, a network stall
// towards the client) holds the transaction's row locks until its
// connection dies, and every other writer of those rows waits as long; with
// it Postgres ends the transaction after d, and the paused process finds it
// gone when it wakes.
func BoundTx(ctx context.Context, tx pgx.Tx, d time.Duration) error {
	ms := d.Milliseconds()
	// No arguments: pgx sends it as one simple-protocol query.
	_, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d; SET LOCAL idle_in_transaction_session_timeout = %d", ms, ms))
	if err != nil {
		return fmt.Errorf("bound transaction: %w", err)
	}
	return nil
}

// MapError maps pgx.ErrNoRows to ErrNotFound and unique or exclusion
// violations to ErrConflict, keeping the original error wrapped too; other
// errors (and nil) pass through unchanged.
func MapError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "23P01") {
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	return err
}

// Dialer returns a function that opens a connection of its own with pool's
// settings, for a LISTEN that holds its connection for good and so must not
// take one from the pool (libs/wake.NewListener).
func Dialer(pool *pgxpool.Pool) func(context.Context) (*pgx.Conn, error) {
	return func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	}
}
