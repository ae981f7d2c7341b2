// Package report records how attempts ended. Reports from concurrent calls
// are coalesced into one transaction: completions are applied with a single
// UPDATE ... FROM unnest, the rarer failures, nacks and abandons with one
// locking read and one UPDATE, and every change writes its task event to the
// outbox in the same transaction.
package report

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/libs/wake"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// Batching limits, as for claims.
const (
	queueSize = 1024
	batchSize = 256
)

// Report kinds, limits and the report itself live with the partition
// engine, which applies them.
const (
	MaxNackDelay        = engine.MaxNackDelay
	DefaultAsyncTimeout = engine.DefaultAsyncTimeout
	MaxAsyncTimeout     = engine.MaxAsyncTimeout
	Complete            = engine.Complete
	Fail                = engine.Fail
	Nack                = engine.Nack
	Abandon             = engine.Abandon
	Pending             = engine.Pending
)

// Kind is how an attempt ended.
type Kind = engine.Kind

// Report is one worker's account of one attempt.
type Report = engine.Report

// Request is one call's reports, all about tasks of Namespace.
type Request struct {
	Namespace string
	Reports   []Report
}

// Notifier is told that the outbox has new rows.
type Notifier interface{ Notify() }

// Reporter applies reports.
type Reporter struct {
	pool  *pgxpool.Pool
	hub   *wake.Hub
	relay Notifier
	batch *coalesce.Batcher[Request, []string]
	tasks *taskevent.Counters
	stale metric.Int64Counter
}

// New returns a Reporter; Run must be running for reports to be applied.
func New(pool *pgxpool.Pool, hub *wake.Hub, relay Notifier, meter metric.Meter) (*Reporter, error) {
	tasks, err := taskevent.NewCounters(meter)
	if err != nil {
		return nil, err
	}
	stale, err := meter.Int64Counter("flo.dispatcher.reports.stale", metric.WithUnit("{report}"),
		metric.WithDescription("Worker reports that matched no running attempt (its lease had expired, the task was final, the id was unknown) and changed nothing."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	r := &Reporter{pool: pool, hub: hub, relay: relay, tasks: tasks, stale: stale}
	r.batch = coalesce.New(queueSize, batchSize, r.exec)
	return r, nil
}

// Run applies coalesced reports until ctx ends.
func (r *Reporter) Run(ctx context.Context) error { return r.batch.Run(ctx) }

// Report applies req's reports and returns the task ids of those that matched
// no running attempt (a lease that expired, a task already final, an unknown
// or malformed id); those change nothing.
func (r *Reporter) Report(ctx context.Context, req Request) ([]string, error) {
	if len(req.Reports) == 0 {
		return nil, nil
	}
	if err := text.Name("namespace", req.Namespace); err != nil {
		return nil, err
	}
	// Free text is repaired, not refused: one worker's NUL-bearing or huge
	// error must not fail the transaction it shares with other reports.
	for i := range req.Reports {
		rep := &req.Reports[i]
		rep.Error, rep.ErrorCode = text.CleanFailure(rep.Error, rep.ErrorCode)
		rep.Outcome = text.Clean(rep.Outcome, text.MaxOutcomeBytes)
	}
	return r.batch.Do(ctx, req)
}

// entry is one report inside a coalesced set.
type entry struct {
	call     int
	report   Report
	id       uuid.UUID
	accepted bool
	// span records the report in its task's trace; traceHeaders is its
	// context.
	span         trace.Span
	traceHeaders map[string]string
}

// plan is what a failure-type report does to its task.
type plan struct {
	disposition store.Disposition
	events      []taskevent.Type
}

// decide maps a non-completion report on a running task to its next state.
// A failure's TimedOut and ErrorCode go on the task; a nack clears them.
func decide(rep Report, t store.RunningTask) plan {
	end := func(status store.Status, delay time.Duration, msg string) store.Disposition {
		d := store.Disposition{ID: t.ID, Status: status, Delay: delay, Error: msg}
		if rep.Kind == Fail {
			d.TimedOut, d.ErrorCode = rep.TimedOut, rep.ErrorCode
		}
		return d
	}
	retry := func(delay time.Duration, msg string) plan {
		if t.Attempt < t.MaxAttempts {
			return plan{end(store.Queued, delay, msg), []taskevent.Type{taskevent.RetryScheduled}}
		}
		return plan{end(store.DeadLettered, 0, msg), []taskevent.Type{taskevent.DeadLettered}}
	}
	switch rep.Kind {
	case Abandon:
		return plan{store.Disposition{ID: t.ID, Status: store.Queued, Uncount: true, KeepError: true}, []taskevent.Type{taskevent.Abandoned}}
	case Pending:
		wait := rep.Delay
		if wait <= 0 {
			wait = DefaultAsyncTimeout
		}
		return plan{store.Disposition{ID: t.ID, Status: store.Waiting, Delay: min(wait, MaxAsyncTimeout), KeepError: true}, []taskevent.Type{taskevent.Waiting}}
	case Nack:
		msg := rep.Error
		if msg == "" {
			msg = "nacked"
		}
		return retry(min(max(rep.Delay, 0), MaxNackDelay), msg)
	default:
		switch {
		case rep.NonRetryable:
			return plan{end(store.Failed, 0, rep.Error), []taskevent.Type{taskevent.Failed}}
		case !rep.Retry:
			return plan{end(store.DeadLettered, 0, rep.Error), []taskevent.Type{taskevent.DeadLettered}}
		default:
			return retry(t.Backoff.Delay(int(t.Attempt)), rep.Error)
		}
	}
}

// exec applies one coalesced set of calls in one transaction.
func (r *Reporter) exec(ctx context.Context, calls []*coalesce.Call[Request, []string]) error {
	var entries []entry
	for i, call := range calls {
		for _, rep := range call.Req.Reports {
			id, err := uuid.Parse(rep.TaskID)
			if err != nil || rep.Kind < Complete || rep.Kind > Pending {
				// A malformed id or a report of no kind can match nothing.
				calls[i].Resp = append(calls[i].Resp, rep.TaskID)
				continue
			}
			entries = append(entries, entry{call: i, report: rep, id: id})
		}
	}
	var (
		queued []requeued
		events *taskevent.Builder
	)
	startSpans(ctx, entries)
	err := pg.InTx(ctx, r.pool, func(tx pgx.Tx) error {
		events = taskevent.NewBuilder(time.Now())
		if err := r.complete(ctx, tx, calls, entries, events); err != nil {
			return err
		}
		var err error
		if queued, err = r.dispose(ctx, tx, calls, entries, events); err != nil {
			return err
		}
		if err := events.Write(ctx, tx, "report"); err != nil {
			return err
		}
		return store.Notify(ctx, tx, store.TasksChannel, dueKeys(queued))
	})
	endSpans(entries, err)
	if err != nil {
		return fmt.Errorf("apply %d reports: %w", len(entries), err)
	}
	for _, e := range entries {
		if !e.accepted {
			calls[e.call].Resp = append(calls[e.call].Resp, e.report.TaskID)
		}
	}
	var stale int64
	for _, call := range calls {
		// Malformed reports were answered before the transaction too.
		stale += int64(len(call.Resp))
	}
	r.stale.Add(ctx, stale)
	r.tasks.Count(ctx, events)
	r.relay.Notify()
	r.hub.Wake(dueKeys(queued)...)
	for _, q := range queued {
		if q.delayed {
			r.hub.WakeAt(q.change.Key(), q.change.RunAt)
		}
	}
	return nil
}

// requeued is a task a report sent back to the queue.
type requeued struct {
	change  store.Change
	delayed bool
}

// dueKeys lists, once each, the queues that got a task claimable at once.
func dueKeys(queued []requeued) []string {
	var keys []string
	seen := map[string]bool{}
	for _, q := range queued {
		if k := q.change.Key(); !q.delayed && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// complete applies the completions among entries with one statement.
func (r *Reporter) complete(ctx context.Context, tx pgx.Tx, calls []*coalesce.Call[Request, []string], entries []entry, events *taskevent.Builder) error {
	var cs []store.Completion
	for _, e := range entries {
		if e.report.Kind == Complete {
			cs = append(cs, store.Completion{
				ID: e.id, Namespace: calls[e.call].Req.Namespace, Attempt: e.report.Attempt,
				Result: e.report.Result, Outcome: e.report.Outcome,
			})
		}
	}
	if len(cs) == 0 {
		return nil
	}
	changes, err := store.CompleteTasks(ctx, tx, cs)
	if err != nil {
		return err
	}
	type attemptKey struct {
		id      uuid.UUID
		attempt int32
	}
	traces := map[attemptKey]map[string]string{}
	for _, e := range entries {
		if e.report.Kind == Complete && e.traceHeaders != nil {
			traces[attemptKey{e.id, e.report.Attempt}] = e.traceHeaders
		}
	}
	done := make(map[attemptKey]bool, len(changes))
	for _, c := range changes {
		done[attemptKey{c.ID, c.Attempt}] = true
		events.Add(taskevent.Completed, traced(c, traces[attemptKey{c.ID, c.Attempt}]))
	}
	for i, e := range entries {
		if e.report.Kind == Complete && done[attemptKey{e.id, e.report.Attempt}] {
			entries[i].accepted = true
		}
	}
	return nil
}

// dispose applies the failures, nacks, abandons and pendings among entries and returns
// the tasks that went back to the queue.
func (r *Reporter) dispose(ctx context.Context, tx pgx.Tx, calls []*coalesce.Call[Request, []string], entries []entry, events *taskevent.Builder) ([]requeued, error) {
	var ids []uuid.UUID
	for _, e := range entries {
		if e.report.Kind != Complete {
			ids = append(ids, e.id)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	running, err := store.LockRunning(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	byID := make(map[uuid.UUID]store.RunningTask, len(running))
	for _, t := range running {
		byID[t.ID] = t
	}
	var (
		ds     []store.Disposition
		plans  = map[uuid.UUID]plan{}
		traces = map[uuid.UUID]map[string]string{}
	)
	for i, e := range entries {
		if e.report.Kind == Complete {
			continue
		}
		t, ok := byID[e.id]
		if _, taken := plans[e.id]; !ok || taken || t.Namespace != calls[e.call].Req.Namespace || t.Attempt != e.report.Attempt {
			continue
		}
		p := decide(e.report, t)
		plans[e.id] = p
		traces[e.id] = e.traceHeaders
		ds = append(ds, p.disposition)
		entries[i].accepted = true
	}
	if len(ds) == 0 {
		return nil, nil
	}
	changes, err := store.DisposeTasks(ctx, tx, ds)
	if err != nil {
		return nil, err
	}
	var queued []requeued
	for _, c := range changes {
		p := plans[c.ID]
		for _, typ := range p.events {
			events.Add(typ, traced(c, traces[c.ID]))
		}
		if c.Status == store.Queued {
			queued = append(queued, requeued{change: c, delayed: p.disposition.Delay > 0})
		}
	}
	return queued, nil
}
