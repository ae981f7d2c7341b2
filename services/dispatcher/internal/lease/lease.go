// Package lease extends and expires task leases. A lease that runs out means
// its worker went silent: the reaper puts the task back in the queue with the
// attempt counted, or dead-letters it when that was the last attempt.
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/sweep"
	"github.com/razorbill/flo/libs/wake"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// reapBatch is how many expired leases one transaction handles.
const reapBatch = 1000

// MaxExtend bounds one lease extension.
const MaxExtend = engine.MaxExtend

// Notifier is told that the outbox has new rows.
type Notifier interface{ Notify() }

// Leases extends and expires leases.
type Leases struct {
	pool  *pgxpool.Pool
	hub   *wake.Hub
	relay Notifier
	log   *slog.Logger
	tasks *taskevent.Counters
}

// New returns Leases.
func New(pool *pgxpool.Pool, hub *wake.Hub, relay Notifier, log *slog.Logger, meter metric.Meter) (*Leases, error) {
	tasks, err := taskevent.NewCounters(meter)
	if err != nil {
		return nil, err
	}
	return &Leases{pool: pool, hub: hub, relay: relay, log: log, tasks: tasks}, nil
}

// ErrNotRunning is wrapped by Touch when the attempt is not running any more.
var ErrNotRunning = engine.ErrNotRunning

// Touch extends a running attempt's lease to now+extend (zero: the task's
// timeout) and returns the new deadline. It fails with ErrNotRunning when the
// attempt is not running, for example because its lease already expired and
// the task went back to the queue.
func (l *Leases) Touch(ctx context.Context, namespace, taskID string, attempt int32, extend time.Duration) (time.Time, error) {
	id, err := uuid.Parse(taskID)
	if err != nil {
		return time.Time{}, fault.Invalidf("task_id %q is not a UUID", taskID)
	}
	if extend < 0 {
		return time.Time{}, fault.Invalidf("extend_ms must not be negative")
	}
	until, err := store.ExtendLease(ctx, l.pool, namespace, id, attempt, min(extend, MaxExtend))
	if errors.Is(err, pg.ErrNotFound) {
		return time.Time{}, fmt.Errorf("touch task %s attempt %d: %w", taskID, attempt, ErrNotRunning)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("touch task %s: %w", taskID, err)
	}
	return until, nil
}

// Run expires leases every interval until ctx ends. Several replicas may run
// it at once: each transaction skips rows another holds.
func (l *Leases) Run(ctx context.Context, interval time.Duration) error {
	return sweep.Every(ctx, interval, l.log, "expire leases", l.ExpireDue)
}

// ExpireDue handles every lease that has run out, in batches, and returns how
// many it handled.
func (l *Leases) ExpireDue(ctx context.Context) (int, error) {
	return sweep.Batches(ctx, reapBatch, l.expireBatch)
}

func (l *Leases) expireBatch(ctx context.Context) (int, error) {
	changes, events, err := taskevent.Sweep(ctx, l.pool, "lease",
		func(tx pgx.Tx) ([]store.Change, error) { return store.ExpireLeases(ctx, tx, reapBatch) },
		func(tx pgx.Tx, events *taskevent.Builder, changes []store.Change) error {
			var due []string
			seen := map[string]bool{}
			for _, c := range changes {
				events.Add(taskevent.LeaseExpired, c)
				if c.Status == store.DeadLettered {
					events.Add(taskevent.DeadLettered, c)
				} else if !seen[c.Key()] {
					seen[c.Key()] = true
					due = append(due, c.Key())
				}
			}
			return store.Notify(ctx, tx, store.TasksChannel, due)
		})
	if err != nil {
		return 0, fmt.Errorf("expire leases: %w", err)
	}
	if len(changes) == 0 {
		return 0, nil
	}
	l.tasks.Count(ctx, events)
	l.relay.Notify()
	for _, c := range changes {
		if c.Status == store.Queued {
			l.hub.Wake(c.Key())
		}
	}
	l.log.InfoContext(ctx, "expired leases", "count", len(changes))
	return len(changes), nil
}
