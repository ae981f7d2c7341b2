package pg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BatchTx is a transaction that spends no round trip of its own on BEGIN and
// COMMIT: BEGIN travels with its first statement or batch and COMMIT with
// its last batch (Commit). A transaction of a read (lock rows) and a write
// then costs two round trips instead of four, which is most of its time
// when Postgres is busy.
//
// BatchTx is a DB for the reads in between. Close it when done: it rolls
// back what was not committed and hands the connection back.
type BatchTx struct {
	conn *pgxpool.Conn
	// tx is the transaction once its first statement was sent.
	tx        pgx.Tx
	committed bool
}

// BeginBatch acquires a connection for a BatchTx; nothing is sent yet.
func BeginBatch(ctx context.Context, pool *pgxpool.Pool) (*BatchTx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin transaction: %w", err)
	}
	return &BatchTx{conn: conn}, nil
}

// InBatchTx runs fn in a BatchTx, which fn ends with Commit. A transaction
// that fn leaves open or that failed is rolled back, and leaving it open is
// an error.
func InBatchTx(ctx context.Context, pool *pgxpool.Pool, fn func(*BatchTx) error) error {
	tx, err := BeginBatch(ctx, pool)
	if err != nil {
		return err
	}
	defer tx.Close(context.WithoutCancel(ctx))
	if err := fn(tx); err != nil {
		return err
	}
	if !tx.committed {
		return errors.New("transaction left open")
	}
	return nil
}

// SendBatch sends b in the transaction, led by BEGIN when b is the first
// thing sent; the results are b's own. A failed BEGIN is the error of every
// statement of b.
func (t *BatchTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.tx != nil {
		return t.tx.SendBatch(ctx, b)
	}
	lead := &pgx.Batch{}
	lead.BeginTx(pgx.TxOptions{})
	lead.QueuedQueries = append(lead.QueuedQueries, b.QueuedQueries...)
	br := t.conn.SendBatch(ctx, lead)
	t.tx = br.Tx()
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgx.FailedBatchResults(b, fmt.Errorf("begin transaction: %w", err))
	}
	return br
}

// Exec runs a statement in the transaction.
func (t *BatchTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.tx != nil {
		return t.tx.Exec(ctx, sql, args...)
	}
	br := t.first(ctx, sql, args)
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs a query in the transaction.
func (t *BatchTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.tx != nil {
		return t.tx.Query(ctx, sql, args...)
	}
	br := t.first(ctx, sql, args)
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return rows, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow runs a query of one row in the transaction.
func (t *BatchTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.tx != nil {
		return t.tx.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	return firstRow{rows: rows, err: err}
}

// first sends the transaction's first statement with BEGIN.
func (t *BatchTx) first(ctx context.Context, sql string, args []any) pgx.BatchResults {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	return t.SendBatch(ctx, b)
}

// Commit sends b, whose statements return no rows that matter, and COMMIT
// in one round trip (with BEGIN too when nothing was sent before). labels,
// when given, say what each statement of b does and lead its error. As
// with any commit, an error leaves the outcome unknown only when the
// connection broke during COMMIT.
func (t *BatchTx) Commit(ctx context.Context, b *pgx.Batch, labels ...string) error {
	n := b.Len()
	b.Queue("COMMIT")
	br := t.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	for i := range n {
		if _, err := br.Exec(); err != nil {
			if i < len(labels) {
				return fmt.Errorf("%s: %w", labels[i], err)
			}
			return err
		}
	}
	tag, err := br.Exec()
	if err == nil {
		err = br.Close()
	}
	if err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	// A transaction that failed earlier ends in ROLLBACK instead.
	if tag.String() == "ROLLBACK" {
		return fmt.Errorf("commit transaction: %w", pgx.ErrTxCommitRollback)
	}
	t.committed = true
	return nil
}

// Close rolls back unless Commit succeeded and releases the connection; a
// connection whose rollback failed is closed rather than reused.
func (t *BatchTx) Close(ctx context.Context) {
	if t.tx != nil && !t.committed {
		_ = t.tx.Rollback(ctx)
	}
	t.conn.Release()
}

// batchRows are the rows of a transaction's first query; closing them
// closes the batch that carried BEGIN.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if r.br != nil {
		r.err = r.br.Close()
		r.br = nil
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// firstRow is the pgx.Row of a transaction's first query.
type firstRow struct {
	rows pgx.Rows
	err  error
}

func (r firstRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
