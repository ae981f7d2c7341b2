package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
)

// Writes are the statements a transaction commits with, queued to go to
// Postgres together with COMMIT (Commit), so a run's change costs a read and
// a write round trip (pg.BatchTx).
type Writes struct {
	b pgx.Batch
	// what says what each statement does, for its error.
	what []string
}

func (w *Writes) queue(what, sql string, args ...any) {
	w.b.Queue(sql, args...)
	w.what = append(w.what, what)
}

// Commit sends w and COMMIT in tx in one round trip; a failed statement's
// error says which of w's statements it was.
func (w *Writes) Commit(ctx context.Context, tx *pg.BatchTx) error {
	return tx.Commit(ctx, &w.b, w.what...)
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
