package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BatchTx is a transaction whose BEGIN goes out with its first batch and
// whose COMMIT goes out with its last. Group reads and settlements are each
// a transaction of two batches on every consumer's path, and under load
// each round trip to Postgres costs as much as the work it carries, so they
// take two round trips instead of the four of a pgx.Tx.
type BatchTx struct {
	conn      *pgxpool.Conn
	begun     bool
	committed bool
}

// InBatchTx runs fn in a BatchTx, which fn ends with Commit. A transaction
// that fn leaves open or that failed is rolled back.
func InBatchTx(ctx context.Context, pool *pgxpool.Pool, fn func(*BatchTx) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	// Release drops a connection that is still in a transaction.
	defer conn.Release()
	tx := &BatchTx{conn: conn}
	err = fn(tx)
	if conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	if err == nil && !tx.committed {
		return errors.New("transaction left open")
	}
	return err
}

// Send sends b, after BEGIN when it is the transaction's first batch; the
// results are b's own.
func (t *BatchTx) Send(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	if t.begun {
		return t.conn.SendBatch(ctx, b), nil
	}
	t.begun = true
	b.QueuedQueries = append([]*pgx.QueuedQuery{{SQL: "BEGIN"}}, b.QueuedQueries...)
	res := t.conn.SendBatch(ctx, b)
	if _, err := res.Exec(); err != nil {
		_ = res.Close()
		return nil, fmt.Errorf("begin transaction: %w", err)
	}
	return res, nil
}

// Commit sends b, whose statements return no rows that matter, with
// COMMIT after it.
func (t *BatchTx) Commit(ctx context.Context, b *pgx.Batch) error {
	n := b.Len()
	b.Queue("COMMIT")
	res, err := t.Send(ctx, b)
	if err != nil {
		return err
	}
	defer res.Close()
	for range n {
		if _, err := res.Exec(); err != nil {
			return err
		}
	}
	tag, err := res.Exec()
	if err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	if tag.String() != "COMMIT" {
		// COMMIT of a transaction that failed rolls it back.
		return errors.New("commit transaction: rolled back")
	}
	if err := res.Close(); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	t.committed = true
	return nil
}
