// Package runner moves workflow runs: it starts them, feeds them task
// events, signals, timers, child ends and cancellations, and applies what the
// engine decides (package engine, pure) to Postgres. Every change of a run
// commits in one transaction with its history, its timers, its signals and the
// records it emits through the outbox (InvokeTask commands, RunEvents), so a
// crash at any point loses or repeats no transition: a redelivered task event
// carries a wait token the run has moved past and changes nothing.
//
// Work is batched at every entry: concurrent starts share a transaction, a
// consumer poll's task events share one, and the timer loop fires due timers
// in batches.
package runner

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/workflow/internal/catalog"
	"github.com/razorbill/flo/services/workflow/internal/plan"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// ConsumerGroup is the workflow service's group on kafka.TaskOutcomesTopic.
const ConsumerGroup = "flo-workflow"

// The runner's fetches of task events wait up to FetchMaxWait (franz-go's
// least) for FetchMinBytes of them. Without it the runner fetched after
// nearly every transaction of every dispatcher partition, most of them
// bringing no step of a workflow: a third of the broker's fetches at 1,000
// tasks/s. A step's completion is seen at most that much later.
const (
	FetchMinBytes = 1 << 20
	FetchMaxWait  = 10 * time.Millisecond
)

// Limits.
const (
	// MaxDepth bounds how deeply child runs nest, so a workflow that starts
	// itself as a child fails instead of recursing forever.
	MaxDepth = 32
	// maxTxAttempts bounds how often a transaction that lost a deadlock or an
	// idempotency-key race is run again.
	maxTxAttempts = 5
	// Coalescing: up to startBatch starts share a transaction; events of one
	// consumer poll arrive as one call per partition.
	startQueue  = 4096
	startBatch  = 512
	eventsQueue = 256
	eventsBatch = 64
)

// Notifier is told that the outbox has new rows.
type Notifier interface{ Notify() }

// TimerWaker is told that a timer was set to fire at a given time, so a
// timer loop sleeping past it wakes up.
type TimerWaker interface{ Wake(at time.Time) }

// Config are the runner's settings.
type Config struct {
	// MaxPayloadBytes bounds a start's input, a signal's payload, a step
	// input an inputMapping builds, and (times PendingPayloadFactor) the
	// payloads of a run's unconsumed signals.
	MaxPayloadBytes int
	// SafetyTick is the timer loop's slowest wake-up; timers set to fire
	// sooner than this are announced to every replica with NOTIFY.
	SafetyTick time.Duration
	// MaxPendingSignalsPerNamespace bounds the signals a namespace's runs
	// hold that no step has taken yet; DefaultMaxPendingSignals when zero.
	MaxPendingSignalsPerNamespace int
}

// DefaultMaxPendingSignals is how many signals no step has taken yet the runs
// of a namespace may hold unless FLO_MAX_PENDING_SIGNALS_PER_NAMESPACE says
// otherwise.
const DefaultMaxPendingSignals = 100000

// Runner moves runs.
type Runner struct {
	pool    *pgxpool.Pool
	catalog *catalog.Catalog
	relay   Notifier
	timers  TimerWaker
	log     *slog.Logger
	cfg     Config
	now     func() time.Time

	// plans holds this replica's plan health, breakers and counters.
	plans *plan.Registry

	starts *coalesce.Batcher[StartRequest, StartResult]
	events *coalesce.Batcher[[]taskEvent, struct{}]

	runsStarted metric.Int64Counter
	runsEnded   metric.Int64Counter
	advances    metric.Int64Counter
	staleEvents metric.Int64Counter
	// scheduleTicks counts schedule ticks by result (fired, skipped).
	scheduleTicks metric.Int64Counter
}

// New returns a Runner. timers may be nil until SetTimerWaker is called;
// meter may be a no-op meter.
func New(pool *pgxpool.Pool, cat *catalog.Catalog, relay Notifier, cfg Config, log *slog.Logger, meter metric.Meter) (*Runner, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.MaxPendingSignalsPerNamespace = cmp.Or(cfg.MaxPendingSignalsPerNamespace, DefaultMaxPendingSignals)
	r := &Runner{pool: pool, catalog: cat, relay: relay, log: log, cfg: cfg, now: time.Now}
	var err error
	if r.runsStarted, err = meter.Int64Counter("flo.workflow.runs.started", metric.WithUnit("{run}"), metric.WithDescription("Workflow runs started, children included.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.runsEnded, err = meter.Int64Counter("flo.workflow.runs.ended", metric.WithUnit("{run}"), metric.WithDescription("Workflow runs that reached a terminal, by status.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.advances, err = meter.Int64Counter("flo.workflow.advances", metric.WithUnit("{advance}"), metric.WithDescription("Engine advances applied to runs.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.staleEvents, err = meter.Int64Counter("flo.workflow.task_events.stale", metric.WithUnit("{event}"), metric.WithDescription("Task events for waits a run had already left (redeliveries, cancelled runs).")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.scheduleTicks, err = meter.Int64Counter("flo.workflow.schedule.ticks", metric.WithUnit("{tick}"), metric.WithDescription("Schedule ticks, by result: fired (a run started) or skipped (max_concurrent runs still going).")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.plans, err = plan.NewRegistry(meter, time.Now); err != nil {
		return nil, fmt.Errorf("create plan registry: %w", err)
	}
	r.starts = coalesce.New(startQueue, startBatch, r.execStarts)
	r.events = coalesce.New(eventsQueue, eventsBatch, r.execEvents)
	return r, nil
}

// SetTimerWaker sets who is told about new timers (the timer loop, which is
// built after the runner because it fires through it).
func (r *Runner) SetTimerWaker(w TimerWaker) { r.timers = w }

// Run executes coalesced starts and task events until ctx ends. Stop the
// consumer and the gRPC server first: their calls fail once Run returned.
func (r *Runner) Run(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- r.events.Run(ctx) }()
	err := r.starts.Run(ctx)
	if e := <-done; err == nil {
		err = e
	}
	return err
}

// inUnit runs fn and commits what it did in one transaction, running the
// whole again when the transaction lost a deadlock (a parent and a child
// locked in opposite orders by two transactions) or an idempotency-key race
// with another replica. fn must therefore be safe to run again.
func (r *Runner) inUnit(ctx context.Context, fn func(u *unit) error) error {
	for attempt := 1; ; attempt++ {
		u := r.newUnit()
		err := r.runUnit(ctx, u, fn)
		if err == nil {
			u.committed(ctx)
			return nil
		}
		if attempt < maxTxAttempts && ctx.Err() == nil &&
			(store.IsRetryable(err) || store.IsUniqueViolation(err, store.IdempotencyIndex)) {
			r.log.DebugContext(ctx, "transaction conflict; running it again", "attempt", attempt, "error", err)
			continue
		}
		return err
	}
}

// runUnit runs fn in a transaction and commits the unit's writes with it.
func (r *Runner) runUnit(ctx context.Context, u *unit, fn func(u *unit) error) error {
	tx, err := pg.BeginBatch(ctx, r.pool)
	if err != nil {
		return err
	}
	defer tx.Close(context.WithoutCancel(ctx))
	u.tx = tx
	if err := fn(u); err != nil {
		return err
	}
	w, err := u.writes(ctx)
	if err != nil {
		return err
	}
	return w.Commit(ctx, tx)
}

// newRunID returns a time-ordered run id, so new runs land at the end of the
// primary key's index.
func newRunID() string { return uuid.Must(uuid.NewV7()).String() }

// random is the engine's jitter source.
func random() float64 { return rand.Float64() }

func statusAttr(s string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("status", s))
}

// SweepPlans deletes expired plan cache entries and rate windows long over,
// for sweep.Every.
func (r *Runner) SweepPlans(ctx context.Context) (int, error) {
	n, err := store.SweepPlans(ctx, r.pool, r.now())
	return int(n), err
}
