// Package claim leases queued tasks to workers. Concurrent claims are
// coalesced: one goroutine takes every pending claim and runs them as one
// batch of UPDATE ... FOR UPDATE SKIP LOCKED statements in a single
// transaction, with their STARTED events. A claim that finds nothing waits on
// the wake hub for its queues, up to its wait time, and then tries again.
package claim

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/libs/wake"
	"github.com/razorbill/flo/services/dispatcher/internal/catalog"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// Limits on one claim.
const (
	MaxCount = 1000
	MaxWait  = 5 * time.Minute
	MaxLease = 24 * time.Hour
)

// Batching limits: claims queued beyond queueSize make callers wait, and one
// transaction serves at most batchSize claims.
const (
	queueSize = 1024
	batchSize = 256
)

// Notifier is told that the outbox has new rows.
type Notifier interface{ Notify() }

// Request asks for up to Count tasks of Actions for worker WorkerID.
type Request struct {
	Namespace string
	WorkerID  string
	Actions   []string
	Count     int
	// Wait is how long to wait for work when none is ready.
	Wait time.Duration
	// Lease is the lease length; zero means each task's timeout.
	Lease time.Duration
}

// Claimer hands out tasks.
type Claimer struct {
	pool    *pgxpool.Pool
	catalog *catalog.Catalog
	hub     *wake.Hub
	relay   Notifier
	batch   *coalesce.Batcher[Request, []store.Claimed]

	tasks         *taskevent.Counters
	passDuration  metric.Float64Histogram
	invokeToStart metric.Float64Histogram

	closeOnce sync.Once
	closing   chan struct{}
}

// New returns a Claimer; Run must be running for claims to be served.
func New(pool *pgxpool.Pool, cat *catalog.Catalog, hub *wake.Hub, relay Notifier, meter metric.Meter) (*Claimer, error) {
	c := &Claimer{pool: pool, catalog: cat, hub: hub, relay: relay, closing: make(chan struct{})}
	var err error
	if c.tasks, err = taskevent.NewCounters(meter); err != nil {
		return nil, err
	}
	if c.passDuration, err = meter.Float64Histogram("flo.tasks.claim.duration", metric.WithUnit("s"),
		metric.WithDescription("Time one pass of a claim took: the catalog check, coalescing and the claim transaction; waiting for work is not included."),
		metric.WithExplicitBucketBoundaries(telemetry.DurationBuckets...)); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if c.invokeToStart, err = meter.Float64Histogram("flo.tasks.invoke_to_start.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a task's invocation to its first attempt being handed to a worker; a delayed invocation includes its delay."),
		metric.WithExplicitBucketBoundaries(telemetry.DurationBuckets...)); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	c.batch = coalesce.New(queueSize, batchSize, c.exec)
	return c, nil
}

// Run executes coalesced claims until ctx ends.
func (c *Claimer) Run(ctx context.Context) error { return c.batch.Run(ctx) }

// Close makes waiting claims return what they have (nothing) at once, so a
// graceful stop does not wait out their wait times.
func (c *Claimer) Close() { c.closeOnce.Do(func() { close(c.closing) }) }

// Claim leases up to req.Count tasks, waiting up to req.Wait for some to
// become ready. It returns no tasks and no error when the wait ran out.
func (c *Claimer) Claim(ctx context.Context, req Request) ([]store.Claimed, error) {
	req, err := c.validate(ctx, req)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(req.Actions))
	for i, a := range req.Actions {
		keys[i] = store.Key(req.Namespace, a)
	}
	w := c.hub.Subscribe(keys)
	defer c.hub.Unsubscribe(w)
	var deadline <-chan time.Time
	if req.Wait > 0 {
		t := time.NewTimer(req.Wait)
		defer t.Stop()
		deadline = t.C
	}
	for {
		start := time.Now()
		tasks, err := c.claimOnce(ctx, req)
		if err == nil {
			c.passDuration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attribute.String("namespace", req.Namespace)))
		}
		if err != nil || len(tasks) > 0 || deadline == nil {
			return tasks, err
		}
		select {
		case <-w.C():
		case <-deadline:
			return nil, nil
		case <-c.closing:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (c *Claimer) claimOnce(ctx context.Context, req Request) ([]store.Claimed, error) {
	// Re-read each time: an action enabled while we waited becomes claimable.
	actions, err := c.catalog.Claimable(ctx, req.Namespace, req.Actions)
	if err != nil || len(actions) == 0 {
		return nil, err
	}
	req.Actions = actions
	return c.batch.Do(ctx, req)
}

func (c *Claimer) validate(ctx context.Context, req Request) (Request, error) {
	if err := c.catalog.CheckNamespace(ctx, req.Namespace); err != nil {
		return req, err
	}
	if err := text.WorkerID("worker_id", req.WorkerID); err != nil {
		return req, err
	}
	if len(req.Actions) == 0 {
		return req, fault.Invalidf("actions must name at least one action")
	}
	for _, a := range req.Actions {
		if err := text.Name("actions", a); err != nil {
			return req, err
		}
	}
	switch {
	case req.Count < 0:
		return req, fault.Invalidf("count must not be negative, got %d", req.Count)
	case req.Count == 0:
		req.Count = 1
	case req.Count > MaxCount:
		req.Count = MaxCount
	}
	if req.Wait < 0 {
		return req, fault.Invalidf("wait_ms must not be negative")
	}
	req.Wait = min(req.Wait, MaxWait)
	if req.Lease < 0 {
		return req, fault.Invalidf("lease_ms must not be negative")
	}
	req.Lease = min(req.Lease, MaxLease)
	return req, nil
}

// exec runs one coalesced set of claims in one transaction. Claims for the
// same namespace and actions share one statement, each contributing Count
// slots, so many workers of one queue cost a single index scan.
func (c *Claimer) exec(ctx context.Context, calls []*coalesce.Call[Request, []store.Claimed]) error {
	var (
		groups []store.ClaimGroup
		owners [][]int // owners[g][slot] is the call the slot belongs to
		index  = map[string]int{}
	)
	for i, call := range calls {
		r := call.Req
		actions := slices.Clone(r.Actions)
		slices.Sort(actions)
		key := r.Namespace + "\x00" + strings.Join(actions, "\x00")
		g, ok := index[key]
		if !ok {
			g = len(groups)
			index[key] = g
			groups = append(groups, store.ClaimGroup{Namespace: r.Namespace, Actions: actions})
			owners = append(owners, nil)
		}
		for range r.Count {
			groups[g].Slots = append(groups[g].Slots, store.ClaimSlot{WorkerID: r.WorkerID, Lease: r.Lease})
			owners[g] = append(owners[g], i)
		}
	}
	var (
		results [][]store.Claimed
		total   int
		events  *taskevent.Builder
	)
	err := pg.InTx(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		if results, err = store.ClaimTasks(ctx, tx, groups); err != nil {
			return err
		}
		events = taskevent.NewBuilder(time.Now())
		total = 0
		for _, got := range results {
			for _, t := range got {
				events.Add(taskevent.Started, t.Change)
			}
			total += len(got)
		}
		if total == 0 {
			return nil
		}
		if err := events.Write(ctx, tx, "started"); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("claim for %d requests: %w", len(calls), err)
	}
	for g, got := range results {
		for _, t := range got {
			call := calls[owners[g][t.Slot]]
			call.Resp = append(call.Resp, t)
		}
	}
	if total > 0 {
		c.relay.Notify()
		c.record(ctx, results, events)
	}
	return nil
}

// record counts claimed tasks and how long first attempts waited since
// their invocation. The invocation time is the gateway's clock and now the
// dispatcher's; on one host or NTP-synced ones the difference is noise next
// to the latencies measured.
func (c *Claimer) record(ctx context.Context, results [][]store.Claimed, events *taskevent.Builder) {
	c.tasks.Count(ctx, events)
	now := time.Now()
	for _, got := range results {
		for _, t := range got {
			if t.Attempt == 1 {
				c.invokeToStart.Record(ctx, now.Sub(t.CreatedAt).Seconds(),
					metric.WithAttributes(attribute.String("namespace", t.Namespace), attribute.String("action", t.Action)))
			}
		}
	}
}
