package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/razorbill/flo/libs/outbox"
)

// Tx is a transaction that spends no round trip of its own on BEGIN and
// COMMIT: BEGIN travels with its first statement and COMMIT with its writes
// (see Writes). A run's change is a read (lock the runs) and a write (every
// row it changes), so it costs two round trips instead of four or more,
// which is most of its time when Postgres is busy.
//
// Tx is a DB for the reads in between. Close it when done: it rolls back
// what was not committed and hands the connection back.
type Tx struct {
	conn *pgxpool.Conn
	// tx is the transaction once its first statement was sent.
	tx        pgx.Tx
	committed bool
}

// Begin acquires a connection for a transaction; nothing is sent yet.
func Begin(ctx context.Context, pool *pgxpool.Pool) (*Tx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin transaction: %w", err)
	}
	return &Tx{conn: conn}, nil
}

// SendBatch sends b in the transaction, led by BEGIN when b is the first
// thing sent.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
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
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
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
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
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
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.tx != nil {
		return t.tx.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	return firstRow{rows: rows, err: err}
}

// first sends the transaction's first statement with BEGIN.
func (t *Tx) first(ctx context.Context, sql string, args []any) pgx.BatchResults {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	return t.SendBatch(ctx, b)
}

// Commit sends w and COMMIT in one round trip (with BEGIN too when nothing
// was sent before). As with any commit, an error leaves the outcome unknown
// only when the connection broke during COMMIT.
func (t *Tx) Commit(ctx context.Context, w *Writes) error {
	w.b.Queue("COMMIT")
	br := t.SendBatch(ctx, &w.b)
	defer func() { _ = br.Close() }()
	for _, what := range w.what {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
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
func (t *Tx) Close(ctx context.Context) {
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

// Writes are the statements a transaction commits with, queued to go to
// Postgres together with COMMIT (Tx.Commit).
type Writes struct {
	b pgx.Batch
	// what says what each statement does, for its error.
	what []string
}

func (w *Writes) queue(what, sql string, args ...any) {
	w.b.Queue(sql, args...)
	w.what = append(w.what, what)
}

// WriteOutbox inserts records into the outbox (libs/outbox).
func (w *Writes) WriteOutbox(ctx context.Context, records []outbox.Record) error {
	if len(records) == 0 {
		return nil
	}
	sql, args, err := outbox.Insert(ctx, records...)
	if err != nil {
		return err
	}
	w.queue(fmt.Sprintf("write %d outbox records", len(records)), sql, args...)
	return nil
}
