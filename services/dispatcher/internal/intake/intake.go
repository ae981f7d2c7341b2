// Package intake turns invocations arriving on flo.actions.commands into
// queued tasks: one transaction per poll inserts every new task with one
// statement, writes their CREATED events to the outbox and notifies other
// replicas, and only then are the poll's offsets committed. The consumer
// hands each partition of a poll to the handler concurrently; those calls are
// coalesced into that one transaction, so a poll costs one commit however
// many partitions it spans.
package intake

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/wake"
	"github.com/razorbill/flo/services/dispatcher/internal/catalog"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// Notifier is told that the outbox has new rows.
type Notifier interface{ Notify() }

// Intake enqueues invocations.
type Intake struct {
	pool    *pgxpool.Pool
	catalog *catalog.Catalog
	hub     *wake.Hub
	relay   Notifier
	log     *slog.Logger
	tasks   *taskevent.Counters
	batch   *coalesce.Batcher[[]Invocation, struct{}]
}

// Batching limits: a poll has at most one call per partition, so these only
// bound a pathological partition count.
const (
	queueSize = 256
	batchSize = 64
)

// New returns an Intake; meter may be a no-op meter.
func New(pool *pgxpool.Pool, cat *catalog.Catalog, hub *wake.Hub, relay Notifier, log *slog.Logger, meter metric.Meter) (*Intake, error) {
	tasks, err := taskevent.NewCounters(meter)
	if err != nil {
		return nil, err
	}
	in := &Intake{pool: pool, catalog: cat, hub: hub, relay: relay, log: log, tasks: tasks}
	in.batch = coalesce.New(queueSize, batchSize, in.exec)
	return in, nil
}

// Run applies coalesced Enqueue calls until ctx ends; stop the consumer
// first, since its calls fail once Run has returned.
func (in *Intake) Run(ctx context.Context) error { return in.batch.Run(ctx) }

// Invocation is one request to run an action.
type Invocation = engine.Invocation

// Enqueue inserts tasks for the invocations, in one transaction with those
// of concurrent calls. Invocations whose task already exists change nothing;
// those naming an action that does not exist, and those with an origin naming
// a disabled one, create no task and a REJECTED event instead, because
// retrying them cannot succeed and must not hold up the partition. An error
// means none of the call's invocations was applied.
//
// When the consumer isolates a failed batch (kafka.Isolated), the call runs
// in a transaction of its own: in a shared one, a bad invocation of another
// partition would fail it again, and the consumer would dead-letter a good
// record for it. Isolating at the consumer, rather than having the
// coalescer split every failed transaction, keeps the cost of a failure on
// the partition that has it, and keeps libs/coalesce unaware of what a
// failure means.
func (in *Intake) Enqueue(ctx context.Context, invs []Invocation) error {
	if len(invs) == 0 {
		return nil
	}
	if kafka.Isolated(ctx) {
		return in.enqueue(ctx, invs)
	}
	_, err := in.batch.Do(ctx, invs)
	return err
}

// exec applies the invocations of coalesced calls in one transaction. Their
// task ids differ (each partition holds its own keys) except for re-sent
// commands, which enqueue deduplicates.
func (in *Intake) exec(ctx context.Context, calls []*coalesce.Call[[]Invocation, struct{}]) error {
	var invs []Invocation
	for _, c := range calls {
		invs = append(invs, c.Req...)
	}
	return in.enqueue(ctx, invs)
}

// enqueue inserts tasks for invs in one transaction.
func (in *Intake) enqueue(ctx context.Context, invs []Invocation) error {
	refs := make([]catalog.Ref, len(invs))
	for i, inv := range invs {
		refs[i] = catalog.Ref{Namespace: inv.Namespace, Action: inv.Action}
	}
	now := time.Now()
	// Delayed tasks wake their queue by timer; the rest at once. A run_at
	// already past counts as "now" in the database's clock.
	delayed := map[uuid.UUID]time.Time{}
	var (
		changes  []store.Change
		rejected []store.Change
		events   *taskevent.Builder
	)
	err := pg.InTx(ctx, in.pool, func(tx pgx.Tx) error {
		actions, err := in.catalog.Lookup(ctx, tx, refs)
		if err != nil {
			return err
		}
		tasks := make([]store.NewTask, 0, len(invs))
		seen := make(map[uuid.UUID]bool, len(invs))
		for _, inv := range invs {
			if seen[inv.TaskID] {
				continue // a re-sent command in the same batch; the first wins
			}
			seen[inv.TaskID] = true
			a, ok := actions[store.Key(inv.Namespace, inv.Action)]
			if !ok || (!a.Enabled && inv.Origin != "") {
				rejected = append(rejected, rejection(inv, ok))
				in.log.WarnContext(ctx, "rejecting invocation", "namespace", inv.Namespace, "action", inv.Action,
					"task_id", inv.TaskID.String(), "reason", rejected[len(rejected)-1].Outcome)
				continue
			}
			runAt := inv.RunAt
			if runAt.After(now) {
				delayed[inv.TaskID] = runAt
			} else {
				runAt = time.Time{}
			}
			settings := a.Settings
			if inv.MaxAttempts > 0 {
				settings.MaxAttempts = inv.MaxAttempts
			}
			tasks = append(tasks, store.NewTask{
				ID: inv.TaskID, Namespace: inv.Namespace, Action: inv.Action, Payload: inv.Payload,
				IdempotencyKey: inv.IdempotencyKey, Priority: inv.Priority, Settings: settings,
				TraceContext: inv.TraceContext, Origin: inv.Origin, CreatedAt: inv.InvokedAt, RunAt: runAt,
			})
		}
		if len(tasks) > 0 {
			if changes, err = store.InsertTasks(ctx, tx, tasks); err != nil {
				return err
			}
		}
		if len(changes) == 0 && len(rejected) == 0 {
			return nil
		}
		events = taskevent.NewBuilder(now)
		for _, c := range changes {
			events.Add(taskevent.Created, c)
		}
		for _, c := range rejected {
			events.Add(taskevent.Rejected, c)
		}
		if err := events.Write(ctx, tx, "created"); err != nil {
			return err
		}
		return store.Notify(ctx, tx, store.TasksChannel, dueKeys(changes, delayed))
	})
	if err != nil {
		return fmt.Errorf("enqueue %d invocations: %w", len(invs), err)
	}
	in.tasks.Count(ctx, events)
	if len(changes) == 0 && len(rejected) == 0 {
		return nil
	}
	in.relay.Notify()
	if len(changes) == 0 {
		return nil
	}
	in.hub.Wake(dueKeys(changes, delayed)...)
	for _, c := range changes {
		if at, ok := delayed[c.ID]; ok {
			in.hub.WakeAt(c.Key(), at)
		}
	}
	return nil
}

// dueKeys lists, once each, the queues of changes that are not delayed.
func dueKeys(changes []store.Change, delayed map[uuid.UUID]time.Time) []string {
	var keys []string
	seen := map[string]bool{}
	for _, c := range changes {
		k := c.Key()
		if _, later := delayed[c.ID]; later || seen[k] {
			continue
		}
		seen[k] = true
		keys = append(keys, k)
	}
	return keys
}

// rejection is the change a REJECTED event reports for inv: the action is
// unknown, or it exists (known) and is disabled.
func rejection(inv Invocation, known bool) store.Change {
	c := store.Change{
		ID: inv.TaskID, Namespace: inv.Namespace, Action: inv.Action, Origin: inv.Origin,
		TraceContext: inv.TraceContext, CreatedAt: inv.InvokedAt,
		Outcome: "target_not_found", Error: fmt.Sprintf("action %q does not exist in namespace %q", inv.Action, inv.Namespace),
	}
	if known {
		c.Outcome = "target_disabled"
		c.Error = fmt.Sprintf("action %q in namespace %q is disabled", inv.Action, inv.Namespace)
	}
	return c
}
