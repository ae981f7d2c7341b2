package roster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/libs/pg"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/registry/internal/store"
	"github.com/razorbill/flo/services/registry/internal/workerevent"
	"github.com/razorbill/flo/services/registry/migrations"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// fixture is a running Roster on a fresh database, with its metrics read
// by reader.
type fixture struct {
	pool   *pgxpool.Pool
	roster *Roster
	reader *sdkmetric.ManualReader
	notes  atomic.Int64
}

func (f *fixture) Notify() { f.notes.Add(1) }

func newFixture(t *testing.T, maxWorkers int) *fixture {
	t.Helper()
	return newFixtureTimeout(t, maxWorkers, 90*time.Second)
}

// newFixtureTimeout is newFixture for a registry whose heartbeat timeout
// is timeout.
func newFixtureTimeout(t *testing.T, maxWorkers int, timeout time.Duration) *fixture {
	t.Helper()
	pool, err := pg.Open(t.Context(), harness.NewDatabase(t), "registry", 16, migrations.FS, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	f := &fixture{pool: pool, reader: sdkmetric.NewManualReader()}
	f.roster, err = New(pool, f, maxWorkers, timeout, sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader)).Meter("test"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.roster.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// batches returns how many batches of kind were written and how many calls
// they held, read from the batch-size histogram.
func (f *fixture) batches(t *testing.T, kind string) (batches, calls int64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, f.reader.Collect(t.Context(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[int64])
			if m.Name != "flo.registry.batch.size" || !ok {
				continue
			}
			for _, dp := range h.DataPoints {
				if v, _ := dp.Attributes.Value(attribute.Key("kind")); v.AsString() == kind {
					batches, calls = batches+int64(dp.Count), calls+dp.Sum
				}
			}
		}
	}
	return batches, calls
}

// together runs n calls at once, each released by one signal, and waits for
// them all.
func together(n int, call func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			call(i)
		})
	}
	close(start)
	wg.Wait()
}

// events reads the worker events in the outbox rows after id, in order.
func (f *fixture) events(t *testing.T, after int64) []*eventsv1.WorkerEvent {
	t.Helper()
	rows, err := f.pool.Query(t.Context(), `SELECT v FROM outbox, unnest(value) AS v WHERE id > $1 ORDER BY id`, after)
	require.NoError(t, err)
	var out []*eventsv1.WorkerEvent
	for rows.Next() {
		var b []byte
		require.NoError(t, rows.Scan(&b))
		ev := &eventsv1.WorkerEvent{}
		require.NoError(t, proto.Unmarshal(b, ev))
		out = append(out, ev)
	}
	require.NoError(t, rows.Err())
	return out
}

func (f *fixture) lastOutboxID(t *testing.T) int64 {
	t.Helper()
	var id int64
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&id))
	return id
}

func requireKind(t *testing.T, want fault.Kind, err error, msgContains string) {
	t.Helper()
	kind, msg, ok := fault.KindOf(err)
	require.True(t, ok, "not a domain error: %v", err)
	require.Equal(t, want, kind, msg)
	require.Contains(t, msg, msgContains)
}

// wid is the id of the i-th worker registerAll registers.
func wid(i int) string { return fmt.Sprintf("w%03d", i) }

// registerAll registers n workers of ns at once (ids wid(0) on) and drains
// the first drained of them.
func (f *fixture) registerAll(t *testing.T, ns string, n, drained int) {
	t.Helper()
	together(n, func(i int) {
		_, err := f.roster.Register(t.Context(), action(ns, wid(i)))
		require.NoError(t, err)
	})
	for i := range drained {
		_, err := f.roster.Drain(t.Context(), ns, wid(i))
		require.NoError(t, err)
	}
}

func action(ns, id string) store.Registration {
	return store.Registration{Namespace: ns, ID: id, Type: store.ActionWorker}
}

// change is the part of a worker event the tests compare.
type change struct {
	Type     eventsv1.WorkerEventType
	From, To store.Status
}

// changes groups events by worker id.
func changes(evs []*eventsv1.WorkerEvent) map[string][]change {
	out := map[string][]change{}
	for _, ev := range evs {
		out[ev.GetWorkerId()] = append(out[ev.GetWorkerId()], change{ev.GetType(), statusOf(ev.GetPreviousStatus()), statusOf(ev.GetStatus())})
	}
	return out
}

func statusOf(s flov1.WorkerStatus) store.Status {
	for _, st := range []store.Status{store.Active, store.Idle, store.Draining, store.Unhealthy} {
		if workerevent.Status(st) == s {
			return st
		}
	}
	return ""
}

const (
	evRegistered = eventsv1.WorkerEventType_WORKER_EVENT_TYPE_REGISTERED
	evChanged    = eventsv1.WorkerEventType_WORKER_EVENT_TYPE_STATUS_CHANGED
)

// TestHeartbeatsCoalesce sends 520 heartbeats at once (500 registered
// workers: active, draining and unhealthy ones; 20 unknown) and checks they
// were written in a few transactions and that each caller got its own
// worker's status, with a STATUS_CHANGED event for each worker whose status
// changed and for no other; then heartbeats that trickle in.
func TestHeartbeatsCoalesce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10_000)
	ctx := t.Context()
	const (
		workers = 500
		unknown = 20
	)
	ns := "beats"
	id := wid
	f.registerAll(t, ns, workers, 50)
	unhealthy := make([]string, 50)
	for i := range unhealthy {
		unhealthy[i] = id(50 + i)
	}
	_, err := f.pool.Exec(ctx, `UPDATE workers SET status = 'unhealthy' WHERE worker_id = ANY($1)`, unhealthy)
	require.NoError(t, err)
	after := f.lastOutboxID(t)

	got := make([]store.Status, workers+unknown)
	errs := make([]error, workers+unknown)
	together(workers+unknown, func(i int) {
		got[i], errs[i] = f.roster.Heartbeat(ctx, store.Beat{Namespace: ns, ID: id(i), CurrentLoad: int32(i % 2), CPULoad: 0.5})
	})

	batches, calls := f.batches(t, "heartbeat")
	t.Logf("%d heartbeats written in %d transactions", calls, batches)
	require.Equal(t, int64(workers+unknown), calls)
	require.LessOrEqual(t, batches, int64(20), "heartbeats were not coalesced")

	byLoad := func(i int) store.Status {
		if i%2 == 1 {
			return store.Active
		}
		return store.Idle
	}
	want := map[string][]change{}
	for i := range workers + unknown {
		switch {
		case i >= workers:
			requireKind(t, fault.NotFound, errs[i], "worker "+id(i)+" not found")
			continue
		case i < 50:
			require.Equal(t, store.Draining, got[i], id(i))
		case i < 100:
			require.Equal(t, byLoad(i), got[i], id(i))
			want[id(i)] = []change{{evChanged, store.Unhealthy, byLoad(i)}}
		default:
			require.Equal(t, byLoad(i), got[i], id(i))
			if byLoad(i) == store.Idle {
				want[id(i)] = []change{{evChanged, store.Active, store.Idle}}
			}
		}
		require.NoError(t, errs[i], id(i))
	}
	require.Equal(t, want, changes(f.events(t, after)))
	var loaded int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM workers WHERE current_load = 1 AND cpu_load = 0.5`).Scan(&loaded))
	require.Equal(t, workers/2, loaded)

	// Heartbeats that trickle in rather than arrive at once (20 workers,
	// each sending its next as soon as the last is answered) still share
	// transactions: each batch lingers for the others.
	const senders, rounds = 20, 10
	together(senders, func(i int) {
		for range rounds {
			_, err := f.roster.Heartbeat(ctx, store.Beat{Namespace: ns, ID: id(100 + i)})
			require.NoError(t, err)
		}
	})
	trickled, trickledCalls := f.batches(t, "heartbeat")
	trickled, trickledCalls = trickled-batches, trickledCalls-calls
	t.Logf("%d trickling heartbeats written in %d transactions", trickledCalls, trickled)
	require.Equal(t, int64(senders*rounds), trickledCalls)
	require.LessOrEqual(t, trickled, int64(senders*rounds/5), "trickling heartbeats were not coalesced")
}

// TestRegistrationStorm registers 1,000 workers at once against a limit of
// 900: exactly 900 get in, in a few transactions, and the other 100 are
// refused with Exhausted.
func TestRegistrationStorm(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 900)
	ctx := t.Context()
	const tries = 1000
	ns := "storm"
	errs := make([]error, tries)
	began := time.Now()
	together(tries, func(i int) {
		_, errs[i] = f.roster.Register(ctx, action(ns, fmt.Sprintf("w%04d", i)))
	})
	took := time.Since(began)
	batches, calls := f.batches(t, "registration")
	t.Logf("%d registrations in %d transactions, %s (%.0f/s)", calls, batches, took.Round(time.Millisecond), tries/took.Seconds())
	require.Equal(t, int64(tries), calls)
	require.LessOrEqual(t, batches, int64(50), "registrations were not batched")

	admitted := 0
	for _, err := range errs {
		if err == nil {
			admitted++
			continue
		}
		requireKind(t, fault.Exhausted, err, "namespace storm has 900 workers, the limit is 900")
	}
	require.Equal(t, 900, admitted)
	var stored int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM workers WHERE namespace = $1`, ns).Scan(&stored))
	require.Equal(t, 900, stored)
	evs := changes(f.events(t, 0))
	require.Len(t, evs, 900)
	for id, chs := range evs {
		require.Equal(t, []change{{evRegistered, "", store.Active}}, chs, id)
	}
}

// runBatch writes regs as one batch, as the batcher would have gathered
// them, and returns each call.
func (f *fixture) runBatch(t *testing.T, regs ...store.Registration) []*registrationCall {
	t.Helper()
	calls := make([]*registrationCall, len(regs))
	for i, reg := range regs {
		generated, err := normalize(&reg)
		require.NoError(t, err)
		calls[i] = &registrationCall{Ctx: t.Context(), Req: registration{Registration: reg, generated: generated}}
	}
	require.NoError(t, f.roster.execRegistrations(t.Context(), calls))
	return calls
}

// TestRegistrationBatch writes one batch holding a replacement, new
// workers, a made-up id, a worker registered twice and one past the limit,
// and checks each gets what registering them one after the other would
// have given.
func TestRegistrationBatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	ctx := t.Context()
	ns := "batch"
	old := action(ns, "a")
	old.Processes = []store.Process{{Name: "old"}}
	_, err := f.roster.Register(ctx, old)
	require.NoError(t, err)
	_, err = f.roster.Drain(ctx, ns, "a")
	require.NoError(t, err)
	after := f.lastOutboxID(t)

	replacement := action(ns, "a")
	replacement.Processes = []store.Process{{Name: "new-b"}, {Name: "new-a"}}
	again := action(ns, "b")
	again.MaxConcurrency = 7
	calls := f.runBatch(t, replacement, action(ns, "b"), action(ns, ""), action(ns, "c"), again, action(ns, "d"))
	for i, c := range calls[:5] {
		require.NoError(t, c.Err, i)
		require.Equal(t, store.Active, c.Resp.Status, i)
	}
	require.Equal(t, []store.Process{{Name: "new-a", Kind: store.ActionProcess}, {Name: "new-b", Kind: store.ActionProcess}}, calls[0].Resp.Processes)
	generated := calls[2].Resp.ID
	require.Regexp(t, regexp.MustCompile(`^worker-[0-9a-f]{8}$`), generated)
	require.Equal(t, int32(7), calls[4].Resp.MaxConcurrency, "the later registration of b wins")
	requireKind(t, fault.Exhausted, calls[5].Err, "namespace batch has 4 workers, the limit is 4")

	a, err := f.roster.Get(ctx, ns, "a")
	require.NoError(t, err)
	require.Equal(t, calls[0].Resp.Processes, a.Processes, "the old processes are gone")
	b, err := f.roster.Get(ctx, ns, "b")
	require.NoError(t, err)
	require.Equal(t, int32(7), b.MaxConcurrency)
	list, _, err := f.roster.List(ctx, ns, page.Page{Limit: 10})
	require.NoError(t, err)
	require.Len(t, list, 4)

	require.Equal(t, map[string][]change{
		"a":       {{evRegistered, store.Draining, store.Active}},
		"b":       {{evRegistered, "", store.Active}, {evRegistered, store.Active, store.Active}},
		"c":       {{evRegistered, "", store.Active}},
		generated: {{evRegistered, "", store.Active}},
	}, changes(f.events(t, after)))
}

// TestRegistrationBatchIsolatesRefusal puts a registration whose metadata
// Postgres refuses between two good ones: only it fails.
func TestRegistrationBatchIsolatesRefusal(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10)
	ns := "isolate"
	bad := action(ns, "bad")
	bad.Metadata = `{"a":"\u0000"}`
	calls := f.runBatch(t, action(ns, "x"), bad, action(ns, "y"))
	require.NoError(t, calls[0].Err)
	requireKind(t, fault.Invalid, calls[1].Err, "metadata")
	require.NoError(t, calls[2].Err)
	list, _, err := f.roster.List(t.Context(), ns, page.Page{Limit: 10})
	require.NoError(t, err)
	require.Len(t, list, 2)
}

// TestBatchLosesItsConnection kills the connection of batches of
// heartbeats and registrations while they wait for a lock another
// transaction holds: every caller gets ErrUnavailable, nothing was written,
// and the next batches work.
func TestBatchLosesItsConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100)
	ctx := t.Context()
	ns := "down"
	const n = 10
	for i := range n {
		_, err := f.roster.Register(ctx, action(ns, fmt.Sprintf("w%d", i)))
		require.NoError(t, err)
	}
	after := f.lastOutboxID(t)

	// The blocker holds every worker's row and the namespace's registration
	// lock, so the batches wait on it with their statements in flight.
	blocker, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(context.WithoutCancel(ctx)) }()
	_, err = blocker.Exec(ctx, `SELECT 1 FROM workers WHERE namespace = $1 FOR UPDATE`, ns)
	require.NoError(t, err)
	_, err = blocker.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('flo.registry.workers/' || $1::text, 0))`, ns)
	require.NoError(t, err)

	var (
		wg       sync.WaitGroup
		answered atomic.Int64
		errs     = make([]error, 2*n)
	)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = f.roster.Heartbeat(ctx, store.Beat{Namespace: ns, ID: fmt.Sprintf("w%d", i), CurrentLoad: 5})
			answered.Add(1)
		})
		wg.Go(func() {
			_, errs[n+i] = f.roster.Register(ctx, action(ns, fmt.Sprintf("new%d", i)))
			answered.Add(1)
		})
	}
	// Each batch in turn reaches the lock and loses its connection, until
	// every call was answered.
	require.Eventually(t, func() bool {
		_, err := f.pool.Exec(ctx, `
			SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`)
		require.NoError(t, err)
		return answered.Load() == 2*n
	}, 30*time.Second, 20*time.Millisecond)
	wg.Wait()
	for i, err := range errs {
		require.ErrorIs(t, err, ErrUnavailable, i)
	}
	require.NoError(t, blocker.Rollback(ctx))

	var loaded, registered int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE current_load > 0), count(*) FROM workers WHERE namespace = $1`, ns).Scan(&loaded, &registered))
	require.Zero(t, loaded, "no heartbeat of a failed batch was written")
	require.Equal(t, n, registered, "no registration of a failed batch was written")
	require.Empty(t, f.events(t, after))

	st, err := f.roster.Heartbeat(ctx, store.Beat{Namespace: ns, ID: "w0", CurrentLoad: 1})
	require.NoError(t, err)
	require.Equal(t, store.Active, st)
	_, err = f.roster.Register(ctx, action(ns, "new0"))
	require.NoError(t, err)
}
