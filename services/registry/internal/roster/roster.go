// Package roster is the registry's record of workers: registration (with the
// per-namespace limit), heartbeats, drain, deregistration and reads. Every
// change that other services care about commits with its WorkerEvent in the
// outbox.
package roster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/registry/internal/store"
	"github.com/razorbill/flo/services/registry/internal/workerevent"
)

// idAttempts bounds how often a made-up id is redrawn when it is taken.
const idAttempts = 8

// Notifier is told that the outbox has new rows.
type Notifier interface{ Notify() }

// Roster registers and tracks workers.
type Roster struct {
	pool         *pgxpool.Pool
	relay        Notifier
	maxWorkers   int
	registered   metric.Int64Counter
	heartbeats   metric.Int64Counter
	deregistered metric.Int64Counter
}

// New returns a Roster admitting at most maxWorkers workers per namespace.
func New(pool *pgxpool.Pool, relay Notifier, maxWorkers int, meter metric.Meter) (*Roster, error) {
	if maxWorkers <= 0 {
		return nil, fmt.Errorf("roster: the worker limit must be positive, got %d", maxWorkers)
	}
	r := &Roster{pool: pool, relay: relay, maxWorkers: maxWorkers}
	var err error
	if r.registered, err = meter.Int64Counter("flo.registry.workers.registered", metric.WithUnit("{worker}"), metric.WithDescription("Worker registrations, replacements included.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.heartbeats, err = meter.Int64Counter("flo.registry.heartbeats", metric.WithUnit("{heartbeat}"), metric.WithDescription("Heartbeats recorded.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.deregistered, err = meter.Int64Counter("flo.registry.workers.deregistered", metric.WithUnit("{worker}"), metric.WithDescription("Workers removed.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	return r, nil
}

// Register creates the record of reg.ID, or replaces it when the id is
// registered already: status back to active, counters reset, processes
// replaced. A new worker that would take its namespace past the limit is
// refused. An empty id is made up ("worker-" and 8 hex digits) and never
// replaces someone else's record.
func (r *Roster) Register(ctx context.Context, reg store.Registration) (store.Worker, error) {
	generated, err := normalize(&reg)
	if err != nil {
		return store.Worker{}, err
	}
	var w store.Worker
	err = pg.InTx(ctx, r.pool, func(tx pgx.Tx) error {
		// Registrations in one namespace take turns, so the count below
		// cannot be overtaken by a concurrent registration.
		if err := store.LockNamespace(ctx, tx, reg.Namespace); err != nil {
			return err
		}
		var (
			count int
			prev  store.Status
			found bool
		)
		for attempt := 1; ; attempt++ {
			var err error
			if count, prev, found, err = store.Occupancy(ctx, tx, reg.Namespace, reg.ID); err != nil {
				return err
			}
			if !found || !generated {
				break
			}
			if attempt == idAttempts {
				return fmt.Errorf("make up a free worker id in %s: %d tries taken", reg.Namespace, attempt)
			}
			reg.ID = newWorkerID()
		}
		if !found && count >= r.maxWorkers {
			return fault.Exhaustedf("namespace %s has %d workers, the limit is %d", reg.Namespace, count, r.maxWorkers)
		}
		var err error
		if w, err = store.PutWorker(ctx, tx, reg); err != nil {
			if errors.Is(err, store.ErrBadMetadata) {
				return fault.Invalidf("metadata: %v", err)
			}
			return err
		}
		rec, err := workerevent.Record(workerevent.Registered, store.Change{
			Namespace: reg.Namespace, WorkerID: reg.ID, From: prev, To: w.Status,
		}, time.Now())
		if err != nil {
			return err
		}
		return outbox.Write(ctx, tx, rec)
	})
	if err != nil {
		return store.Worker{}, fmt.Errorf("register worker %s/%s: %w", reg.Namespace, reg.ID, err)
	}
	r.relay.Notify()
	r.registered.Add(ctx, 1)
	return w, nil
}

// Heartbeat records a worker's load and returns its status: draining once a
// drain was asked for, otherwise active with work in hand and idle without.
// A heartbeat from an unhealthy worker makes it active or idle again. An
// unknown worker gets NotFound, which tells the SDK to register again.
func (r *Roster) Heartbeat(ctx context.Context, b store.Beat) (store.Status, error) {
	if err := validateBeat(b); err != nil {
		return "", err
	}
	ev, err := statusEvent(ctx, b)
	if err != nil {
		return "", err
	}
	c, err := store.Heartbeat(ctx, r.pool, b, ev)
	if errors.Is(err, pg.ErrNotFound) {
		return "", notFound(b.Namespace, b.ID)
	}
	if err != nil {
		return "", err
	}
	r.heartbeats.Add(ctx, 1)
	if c.From != c.To {
		r.relay.Notify()
	}
	return c.To, nil
}

// statusEvent encodes, for each status a heartbeat could move the worker out
// of, the event announcing that move; the store picks the one that applies.
func statusEvent(ctx context.Context, b store.Beat) (store.StatusEvent, error) {
	to := store.Idle
	if b.CurrentLoad > 0 {
		to = store.Active
	}
	headers, err := json.Marshal(kafka.TraceHeaders(ctx))
	if err != nil {
		return store.StatusEvent{}, fmt.Errorf("encode trace headers: %w", err)
	}
	ev := store.StatusEvent{
		Topic:      workerevent.Topic,
		Key:        workerevent.Key(b.Namespace, b.ID),
		Headers:    string(headers),
		ByPrevious: make(map[store.Status][]byte, 2),
	}
	// One event id for all of them: at most one is written.
	id, at := uuid.NewString(), time.Now()
	for _, from := range []store.Status{store.Active, store.Idle, store.Unhealthy} {
		if from == to {
			continue
		}
		c := store.Change{Namespace: b.Namespace, WorkerID: b.ID, From: from, To: to}
		if ev.ByPrevious[from], err = workerevent.Encode(workerevent.StatusChanged, c, id, at); err != nil {
			return store.StatusEvent{}, err
		}
	}
	return ev, nil
}

// Drain marks a worker draining: the dispatcher stops handing it tasks and
// the gateway tells it at once. Draining a draining worker changes nothing
// and emits nothing.
func (r *Roster) Drain(ctx context.Context, namespace, id string) (store.Worker, error) {
	if err := requireIDs(namespace, id); err != nil {
		return store.Worker{}, err
	}
	var (
		w       store.Worker
		changed bool
	)
	err := pg.InTx(ctx, r.pool, func(tx pgx.Tx) error {
		c, err := store.Drain(ctx, tx, namespace, id)
		if err != nil {
			return err
		}
		if changed = c.From != c.To; changed {
			rec, err := workerevent.Record(workerevent.StatusChanged, c, time.Now())
			if err != nil {
				return err
			}
			if err := outbox.Write(ctx, tx, rec); err != nil {
				return err
			}
		}
		w, err = store.GetWorker(ctx, tx, namespace, id)
		return err
	})
	if errors.Is(err, pg.ErrNotFound) {
		return store.Worker{}, notFound(namespace, id)
	}
	if err != nil {
		return store.Worker{}, fmt.Errorf("drain worker %s/%s: %w", namespace, id, err)
	}
	if changed {
		r.relay.Notify()
	}
	return w, nil
}

// Deregister removes a worker and its processes. Removing a worker that is
// not registered succeeds and emits nothing: the SDK deregisters on every
// shutdown, including after a registry restart or a second Close, and the
// outcome it wants (no record) holds either way.
func (r *Roster) Deregister(ctx context.Context, namespace, id string) error {
	if err := requireIDs(namespace, id); err != nil {
		return err
	}
	removed := false
	err := pg.InTx(ctx, r.pool, func(tx pgx.Tx) error {
		prev, err := store.DeleteWorker(ctx, tx, namespace, id)
		if errors.Is(err, pg.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		removed = true
		rec, err := workerevent.Record(workerevent.Deregistered, store.Change{Namespace: namespace, WorkerID: id, From: prev}, time.Now())
		if err != nil {
			return err
		}
		return outbox.Write(ctx, tx, rec)
	})
	if err != nil {
		return fmt.Errorf("deregister worker %s/%s: %w", namespace, id, err)
	}
	if removed {
		r.relay.Notify()
		r.deregistered.Add(ctx, 1)
	}
	return nil
}

// Get reads one worker with its processes.
func (r *Roster) Get(ctx context.Context, namespace, id string) (store.Worker, error) {
	if err := requireIDs(namespace, id); err != nil {
		return store.Worker{}, err
	}
	w, err := store.GetWorker(ctx, r.pool, namespace, id)
	if errors.Is(err, pg.ErrNotFound) {
		return store.Worker{}, notFound(namespace, id)
	}
	return w, err
}

// List reads a page of a namespace's workers with their processes, by id,
// with the token of the next page.
func (r *Roster) List(ctx context.Context, namespace string, p page.Page) ([]store.Worker, string, error) {
	if namespace == "" {
		return nil, "", fault.Invalidf("namespace is required")
	}
	ws, err := store.ListWorkers(ctx, r.pool, namespace, p.Part(0), p.Fetch())
	if err != nil {
		return nil, "", err
	}
	ws, next := page.Cut(p, ws, func(w store.Worker) []string { return []string{w.ID} })
	return ws, next, nil
}

func notFound(namespace, id string) error {
	return fault.NotFoundf("worker %s not found in namespace %s", id, namespace)
}
