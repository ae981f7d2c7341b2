// Package health marks workers unhealthy when they fall silent. Every replica
// runs the check; each transaction takes only rows no one else holds, so two
// replicas never mark the same worker or emit its change twice. Unhealthy
// workers are kept: their next heartbeat makes them active or idle again.
package health

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/sweep"
	"github.com/razorbill/flo/services/registry/internal/store"
	"github.com/razorbill/flo/services/registry/internal/workerevent"
)

// batch is how many workers one transaction marks.
const batch = 1000

// Notifier is told that the outbox has new rows.
type Notifier interface{ Notify() }

// Checker marks silent workers unhealthy.
type Checker struct {
	pool    *pgxpool.Pool
	relay   Notifier
	timeout time.Duration
	log     *slog.Logger
	marked  metric.Int64Counter
}

// New returns a Checker treating a worker as silent once its last heartbeat
// is older than timeout. Draining workers are left alone: draining is
// sticky, and a draining worker that falls silent is still one that must get
// no new tasks.
func New(pool *pgxpool.Pool, relay Notifier, timeout time.Duration, log *slog.Logger, meter metric.Meter) (*Checker, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("health: the heartbeat timeout must be positive, got %s", timeout)
	}
	marked, err := meter.Int64Counter("flo.registry.workers.marked_unhealthy", metric.WithUnit("{worker}"), metric.WithDescription("Workers marked unhealthy after missing heartbeats."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	return &Checker{pool: pool, relay: relay, timeout: timeout, log: log, marked: marked}, nil
}

// Run checks every interval until ctx ends.
func (c *Checker) Run(ctx context.Context, interval time.Duration) error {
	return sweep.Every(ctx, interval, c.log, "check worker health", c.Check)
}

// Check marks every silent worker unhealthy, in batches, and returns how many
// it marked.
func (c *Checker) Check(ctx context.Context) (int, error) {
	return sweep.Batches(ctx, batch, c.checkBatch)
}

func (c *Checker) checkBatch(ctx context.Context) (int, error) {
	var changes []store.Change
	// When no worker is due, as nearly always, this is one indexed
	// statement and a COMMIT.
	err := pg.InBatchTx(ctx, c.pool, func(tx *pg.BatchTx) error {
		var err error
		if changes, err = store.MarkUnhealthy(ctx, tx, c.timeout, batch); err != nil {
			return err
		}
		at := time.Now()
		records := make([]outbox.Record, len(changes))
		for i, ch := range changes {
			if records[i], err = workerevent.Record(workerevent.StatusChanged, ch, at); err != nil {
				return err
			}
		}
		return store.Commit(ctx, tx, records)
	})
	if err != nil {
		return 0, fmt.Errorf("mark silent workers unhealthy: %w", err)
	}
	if len(changes) == 0 {
		return 0, nil
	}
	c.relay.Notify()
	c.marked.Add(ctx, int64(len(changes)))
	c.log.InfoContext(ctx, "marked silent workers unhealthy", "count", len(changes), "timeout", c.timeout)
	for _, ch := range changes {
		c.log.DebugContext(ctx, "worker unhealthy", "namespace", ch.Namespace, "worker_id", ch.WorkerID, "was", ch.From)
	}
	return len(changes), nil
}
