// Package sweep runs the periodic batched jobs services share the shape of,
// such as expiring leases or marking silent workers: every interval, a job
// that works through what is due in batches until a batch comes back short,
// so a backlog clears at once while a quiet tick costs one query.
package sweep

import (
	"context"
	"log/slog"
	"time"
)

// Every runs job every interval until ctx ends, then returns nil. A failed
// job is logged as msg and runs again at the next tick. job reports how many
// items it handled, as Batches does; Every only looks at its error.
func Every(ctx context.Context, interval time.Duration, log *slog.Logger, msg string, job func(context.Context) (int, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := job(ctx); err != nil && ctx.Err() == nil {
			log.ErrorContext(ctx, msg, "error", err)
		}
	}
}

// Batches calls batch until it fails or handles fewer than size items, and
// returns how many items it handled in all.
func Batches(ctx context.Context, size int, batch func(context.Context) (int, error)) (int, error) {
	total := 0
	for {
		n, err := batch(ctx)
		total += n
		if err != nil || n < size {
			return total, err
		}
	}
}
