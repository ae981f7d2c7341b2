package roster

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/registry/internal/health"
	"github.com/razorbill/flo/services/registry/internal/store"
)

// versions reads the row version (xmin, and xmax, which a row lock sets) of
// each of a namespace's workers.
func (f *fixture) versions(t *testing.T, ns string) map[string]string {
	t.Helper()
	rows, err := f.pool.Query(t.Context(), `SELECT worker_id, xmin::text || '/' || xmax::text FROM workers WHERE namespace = $1`, ns)
	require.NoError(t, err)
	out := map[string]string{}
	for rows.Next() {
		var id, v string
		require.NoError(t, rows.Scan(&id, &v))
		out[id] = v
	}
	require.NoError(t, rows.Err())
	return out
}

// rewritten returns the ids whose row version differs between two reads.
func rewritten(before, after map[string]string) []string {
	var out []string
	for id, v := range after {
		if before[id] != v {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// TestIdleHeartbeatsWriteNothing heartbeats 200 workers (draining, active
// and idle ones) twice within half the heartbeat timeout: the second round
// rewrites and locks no row and writes no event, and every answer is still
// its worker's status. Then a round where some workers are due a write: a
// row heard from longer ago than half the timeout, a load change, a status
// change, an unhealthy worker; exactly those rows are written, with an
// event for each status change.
func TestIdleHeartbeatsWriteNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1000)
	ctx := t.Context()
	const workers = 200
	ns := "idle"
	id := wid
	ids := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, id(i))
		}
		return out
	}
	f.registerAll(t, ns, workers, 20)
	// Workers 0-19 draining, 20-99 with work (active), 100-199 without
	// (idle); one unknown worker at the end. cpu and memory load change on
	// every round, as they do.
	loads := make([]int32, workers)
	for i := 20; i < 100; i++ {
		loads[i] = 1
	}
	round := func(n int) ([]store.Status, []error) {
		beats := make([]store.Beat, workers+1)
		for i := range workers + 1 {
			beats[i] = store.Beat{Namespace: ns, ID: id(i), CPULoad: float64(n) / 10, MemoryLoad: float64(n) / 20}
			if i < workers {
				beats[i].CurrentLoad = loads[i]
			}
		}
		return f.roster.Heartbeats(ctx, beats)
	}
	want := func(i int) store.Status {
		switch {
		case i < 20:
			return store.Draining
		case loads[i] > 0:
			return store.Active
		}
		return store.Idle
	}
	requireAnswers := func(sts []store.Status, errs []error) {
		t.Helper()
		for i := range workers {
			require.NoError(t, errs[i], id(i))
			require.Equal(t, want(i), sts[i], id(i))
		}
		requireKind(t, fault.NotFound, errs[workers], "worker "+id(workers)+" not found")
	}
	requireAnswers(round(1))

	before := f.versions(t, ns)
	after := f.lastOutboxID(t)
	requireAnswers(round(2))
	require.Empty(t, rewritten(before, f.versions(t, ns)), "heartbeats of workers heard from lately rewrote or locked rows")
	require.Empty(t, f.events(t, after))
	var noise int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM workers WHERE cpu_load = 0.2`).Scan(&noise))
	require.Zero(t, noise, "cpu load alone is not written")

	// Due: 100-109 last heard from just past half the timeout; 0-4
	// (draining) and 20-29 (active) with a changed load; 110-119 turning
	// active; 120-129 unhealthy. Not due: 130, heard from just within half
	// the timeout.
	_, err := f.pool.Exec(ctx, `UPDATE workers SET last_heartbeat = now() - interval '46 seconds' WHERE worker_id = ANY($1)`, ids(100, 110))
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE workers SET last_heartbeat = now() - interval '40 seconds' WHERE worker_id = $1`, id(130))
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE workers SET status = 'unhealthy' WHERE worker_id = ANY($1)`, ids(120, 130))
	require.NoError(t, err)
	for i := range 5 {
		loads[i] = 1
	}
	for i := 20; i < 30; i++ {
		loads[i] = 2
	}
	for i := 110; i < 120; i++ {
		loads[i] = 3
	}
	before = f.versions(t, ns)
	after = f.lastOutboxID(t)
	requireAnswers(round(3))
	written := slices.Concat(ids(0, 5), ids(20, 30), ids(100, 130))
	slices.Sort(written)
	require.Equal(t, written, rewritten(before, f.versions(t, ns)))
	wantEvents := map[string][]change{}
	for _, w := range ids(110, 120) {
		wantEvents[w] = []change{{evChanged, store.Idle, store.Active}}
	}
	for _, w := range ids(120, 130) {
		wantEvents[w] = []change{{evChanged, store.Unhealthy, store.Idle}}
	}
	require.Equal(t, wantEvents, changes(f.events(t, after)))

	rows, err := f.pool.Query(ctx, `
		SELECT worker_id, current_load, cpu_load FROM workers
		WHERE namespace = $1 AND last_heartbeat > now() - interval '10 seconds'`, ns)
	require.NoError(t, err)
	fresh := map[string][2]float64{}
	for rows.Next() {
		var (
			w    string
			load int32
			cpu  float64
		)
		require.NoError(t, rows.Scan(&w, &load, &cpu))
		fresh[w] = [2]float64{float64(load), cpu}
	}
	require.NoError(t, rows.Err())
	require.NotContains(t, fresh, id(130))
	for _, w := range ids(100, 110) {
		require.Equal(t, [2]float64{0, 0.3}, fresh[w], "%s: a row due is written, cpu load with it", w)
	}
	require.Equal(t, [2]float64{1, 0.3}, fresh[id(0)])
	require.Equal(t, [2]float64{2, 0.3}, fresh[id(25)])
	require.Equal(t, [2]float64{3, 0.3}, fresh[id(115)])
}

// TestLiveWorkerNeverUnhealthy runs the health check on a short timeout (3
// s, so beats within 1.5 s of the last write are skipped) against a worker
// heartbeating every 600 ms, one every 1.8 s (longer than half the timeout)
// and one silent: the check marks only the silent one, the first has most
// of its beats skipped, and every beat of the second writes.
func TestLiveWorkerNeverUnhealthy(t *testing.T) {
	t.Parallel()
	const (
		timeout = 3 * time.Second
		tick    = 600 * time.Millisecond
		ticks   = 8
	)
	f := newFixtureTimeout(t, 10, timeout)
	ctx := t.Context()
	ns := "live"
	checker, err := health.New(f.pool, f, timeout, slog.New(slog.DiscardHandler), noop.NewMeterProvider().Meter("test"))
	require.NoError(t, err)
	for _, w := range []string{"often", "seldom", "silent"} {
		_, err := f.roster.Register(ctx, action(ns, w))
		require.NoError(t, err)
	}
	writes := map[string]int{}
	beats := map[string]int{}
	beat := func(w string) {
		before := f.versions(t, ns)[w]
		st, err := f.roster.Heartbeat(ctx, store.Beat{Namespace: ns, ID: w})
		require.NoError(t, err)
		require.Equal(t, store.Idle, st, w)
		beats[w]++
		if f.versions(t, ns)[w] != before {
			writes[w]++
		}
	}
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	for n := range ticks {
		if n > 0 {
			<-ticker.C
		}
		_, err := checker.Check(ctx)
		require.NoError(t, err)
		beat("often")
		if n%3 == 0 {
			beat("seldom")
		}
	}
	require.Eventually(t, func() bool {
		_, err := checker.Check(ctx)
		require.NoError(t, err)
		return len(changes(f.events(t, 0))["silent"]) == 2
	}, 10*time.Second, 50*time.Millisecond, "the silent worker is marked unhealthy")
	evs := changes(f.events(t, 0))
	require.Equal(t, []change{{evRegistered, "", store.Active}, {evChanged, store.Active, store.Unhealthy}}, evs["silent"])
	for _, w := range []string{"often", "seldom"} {
		require.Equal(t, []change{{evRegistered, "", store.Active}, {evChanged, store.Active, store.Idle}}, evs[w], w)
	}
	t.Logf("beats %v, rows written %v", beats, writes)
	require.Equal(t, beats["seldom"], writes["seldom"], "beats further apart than half the timeout all write")
	require.Less(t, writes["often"], beats["often"]/2+1, "most beats of a worker heartbeating often write nothing")
	require.GreaterOrEqual(t, writes["often"], 2, "a worker heartbeating often is still written once its row is due")
}
