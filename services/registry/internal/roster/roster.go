// Package roster is the registry's record of workers: registration (with the
// per-namespace limit), heartbeats, drain, deregistration and reads. Every
// change that other services care about commits with its WorkerEvent in the
// outbox.
package roster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/registry/internal/store"
	"github.com/razorbill/flo/services/registry/internal/workerevent"
)

// idAttempts bounds how often a made-up id is redrawn when it is taken.
const idAttempts = 8

// Batch bounds. A batch is one transaction; calls beyond a full queue wait
// for room. A heartbeat batch lingers a little for more: 10,000 workers
// heartbeat 333 times a second, spread out, and would otherwise mostly find
// the writer idle and go one to a transaction. Registrations do not
// linger: they come alone (answered at once) or in storms (which batch by
// themselves).
const (
	heartbeatQueue    = 4096
	heartbeatBatch    = 1000
	heartbeatLinger   = 50 * time.Millisecond
	registrationQueue = 4096
	registrationBatch = 500
)

// A heartbeat that changes nothing but the time leaves its worker's row
// alone while the stored last_heartbeat is younger than the heartbeat
// timeout divided by freshDivisor (see store.Heartbeats). That is safe: for a
// worker heartbeating every interval i, a beat is skipped only when the
// stored time is younger than timeout/2, so the beat after it, i later,
// finds it at most timeout/2 + i old and writes if it is older than
// timeout/2. With i < timeout/2 the stored time is never older than
// timeout/2 + i, under the timeout, and the rest (15 s with the defaults,
// i = 30 s and a 90 s timeout: never older than about 75 s) absorbs late
// beats, so the health check never marks a live worker unhealthy. With
// i >= timeout/2 every beat finds its row older than timeout/2 and writes,
// as if nothing were skipped. Deriving it from the timeout keeps a shorter
// timeout as safe.
const freshDivisor = 2

// ErrUnavailable wraps the error of a batch that failed for a reason that
// is not the callers' (Postgres down or restarting, a lost connection, a
// deadlock): nothing of the batch was written and the call can be retried.
var ErrUnavailable = errors.New("the worker registry's database is unavailable; retry")

// Notifier is told that the outbox has new rows.
type Notifier interface{ Notify() }

// Roster registers and tracks workers.
type Roster struct {
	pool          *pgxpool.Pool
	relay         Notifier
	maxWorkers    int
	fresh         time.Duration
	registrations *coalesce.Batcher[registration, store.Worker]
	heartbeats    *coalesce.Batcher[store.Beat, store.Status]
	registered    metric.Int64Counter
	beats         metric.Int64Counter
	deregistered  metric.Int64Counter
	batchSize     metric.Int64Histogram
	callSize      metric.Int64Histogram
}

// New returns a Roster admitting at most maxWorkers workers per namespace,
// for a registry that marks workers silent for heartbeatTimeout unhealthy.
// Registrations and heartbeats are written while Run runs.
func New(pool *pgxpool.Pool, relay Notifier, maxWorkers int, heartbeatTimeout time.Duration, meter metric.Meter) (*Roster, error) {
	if maxWorkers <= 0 {
		return nil, fmt.Errorf("roster: the worker limit must be positive, got %d", maxWorkers)
	}
	if heartbeatTimeout <= 0 {
		return nil, fmt.Errorf("roster: the heartbeat timeout must be positive, got %s", heartbeatTimeout)
	}
	r := &Roster{pool: pool, relay: relay, maxWorkers: maxWorkers, fresh: heartbeatTimeout / freshDivisor}
	r.registrations = coalesce.New(registrationQueue, registrationBatch, r.execRegistrations)
	r.heartbeats = coalesce.New(heartbeatQueue, heartbeatBatch, r.execHeartbeats).Linger(heartbeatLinger)
	var err error
	if r.registered, err = meter.Int64Counter("flo.registry.workers.registered", metric.WithUnit("{worker}"), metric.WithDescription("Worker registrations, replacements included.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.beats, err = meter.Int64Counter("flo.registry.heartbeats", metric.WithUnit("{heartbeat}"), metric.WithDescription("Heartbeats recorded.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.deregistered, err = meter.Int64Counter("flo.registry.workers.deregistered", metric.WithUnit("{worker}"), metric.WithDescription("Workers removed.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.batchSize, err = meter.Int64Histogram("flo.registry.batch.size", metric.WithUnit("{call}"),
		metric.WithDescription("Calls written by one transaction, by kind (heartbeat, registration)."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.callSize, err = meter.Int64Histogram("flo.registry.heartbeat_call.size", metric.WithUnit("{heartbeat}"),
		metric.WithDescription("Heartbeats carried by one Heartbeats call: a gateway's batch of the heartbeats its worker streams carried."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	return r, nil
}

// Run writes batches of registrations and heartbeats until ctx ends; calls
// made after that fail with coalesce.ErrStopped.
func (r *Roster) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.registrations.Run(ctx) })
	wg.Go(func() { _ = r.heartbeats.Run(ctx) })
	wg.Wait()
	return nil
}

// Register creates the record of reg.ID, or replaces it when the id is
// registered already: status back to active, counters reset, processes
// replaced. A new worker that would take its namespace past the limit is
// refused. An empty id is made up ("worker-" and 8 hex digits) and never
// replaces someone else's record. Concurrent registrations are written
// together (see execRegistrations); Register returns once its batch
// committed.
func (r *Roster) Register(ctx context.Context, reg store.Registration) (store.Worker, error) {
	generated, err := normalize(&reg)
	if err != nil {
		return store.Worker{}, err
	}
	w, err := r.registrations.Do(ctx, registration{Registration: reg, generated: generated})
	if err != nil {
		return store.Worker{}, fmt.Errorf("register worker %s/%s: %w", reg.Namespace, reg.ID, err)
	}
	return w, nil
}

// Heartbeat records a worker's load and returns its status: draining once a
// drain was asked for, otherwise active with work in hand and idle without.
// A heartbeat from an unhealthy worker makes it active or idle again. One
// that changes neither status nor current_load, of a worker heard from
// within half the heartbeat timeout, writes nothing (see freshDivisor). An
// unknown worker gets NotFound, which tells the SDK to register again.
// Concurrent heartbeats are written together (see execHeartbeats); Heartbeat
// returns once its batch committed.
func (r *Roster) Heartbeat(ctx context.Context, b store.Beat) (store.Status, error) {
	if err := validateBeat(b); err != nil {
		return "", err
	}
	st, err := r.heartbeats.Do(ctx, b)
	if err != nil {
		return "", fmt.Errorf("heartbeat of %s/%s: %w", b.Namespace, b.ID, err)
	}
	return st, nil
}

// Heartbeats records many workers' heartbeats, each as Heartbeat does, and
// answers each: errs[i] says why beats[i] was not recorded (Invalid,
// NotFound, or the failure of its batch), statuses[i] is its worker's status
// otherwise. They join the batches of the heartbeats arriving meanwhile.
func (r *Roster) Heartbeats(ctx context.Context, beats []store.Beat) (statuses []store.Status, errs []error) {
	r.callSize.Record(ctx, int64(len(beats)))
	statuses, errs = make([]store.Status, len(beats)), make([]error, len(beats))
	valid := make([]store.Beat, 0, len(beats))
	at := make([]int, 0, len(beats))
	for i, b := range beats {
		if errs[i] = validateBeat(b); errs[i] == nil {
			valid = append(valid, b)
			at = append(at, i)
		}
	}
	sts, verrs := r.heartbeats.DoAll(ctx, valid)
	for j, i := range at {
		statuses[i] = sts[j]
		if verrs[j] != nil {
			errs[i] = fmt.Errorf("heartbeat of %s/%s: %w", valid[j].Namespace, valid[j].ID, verrs[j])
		}
	}
	return statuses, errs
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
