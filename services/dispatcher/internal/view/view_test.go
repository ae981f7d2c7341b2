package view_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/view"
	"github.com/razorbill/flo/services/dispatcher/migrations"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// openDB migrates a fresh database and returns a pool on it.
func openDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pg.Open(t.Context(), harness.NewDatabase(t), "dispatcher", 4, migrations.FS, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// flushed records what onFlushed was called with.
type flushed struct {
	mu   sync.Mutex
	last map[int32]int64
}

func (f *flushed) record(p int32, offset int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last[p] = offset
}

func (f *flushed) get() map[int32]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[int32]int64, len(f.last))
	for p, o := range f.last {
		out[p] = o
	}
	return out
}

func newMaterializer(t *testing.T, pool *pgxpool.Pool, log *slog.Logger) (*view.Materializer, *flushed) {
	t.Helper()
	return newMaterializerWith(t, pool, log, noop.NewMeterProvider().Meter("test"))
}

func newMaterializerWith(t *testing.T, pool *pgxpool.Pool, log *slog.Logger, meter metric.Meter) (*view.Materializer, *flushed) {
	t.Helper()
	f := &flushed{last: map[int32]int64{}}
	m, err := view.NewMaterializer(pool, 4, log, meter, f.record)
	require.NoError(t, err)
	return m, f
}

// observed is a materializer whose logs and metrics the test reads.
func observed(t *testing.T, pool *pgxpool.Pool) (*view.Materializer, *flushed, *logLines, sdkmetric.Reader) {
	t.Helper()
	lines := &logLines{}
	reader := sdkmetric.NewManualReader()
	m, flushes := newMaterializerWith(t, pool, slog.New(lines), sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test"))
	return m, flushes, lines, reader
}

// run runs m until the test ends.
func run(t *testing.T, m *view.Materializer) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// now is a time Postgres keeps exactly (microseconds, UTC).
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// queued is a freshly created task with every creation field set.
func queued(ns string) engine.Task {
	at := now()
	return engine.Task{
		ID: uuid.New(), Namespace: ns, Action: "send", Status: store.Queued, Priority: 3,
		Payload: []byte(`{"to":"a"}`), IdempotencyKey: "key-" + uuid.NewString(),
		Settings: store.Settings{Timeout: 30 * time.Second, MaxAttempts: 5,
			Backoff: backoff.Policy{Kind: backoff.Linear, Initial: time.Second, Max: time.Minute, Multiplier: 1.5}},
		TraceContext: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		Origin:       "workflow", CreatedAt: at, RunAt: at.Add(time.Second), UpdatedAt: at,
	}
}

// running is t claimed by a worker: no payload, as a STARTED record has none.
func running(t engine.Task) engine.Task {
	at := now()
	t.Status, t.Attempt, t.WorkerID, t.Payload = store.Running, t.Attempt+1, "worker-1", nil
	t.StartedAt, t.LeaseUntil, t.UpdatedAt = at, at.Add(30*time.Second), at
	t.CompletionSecret = []byte("0123456789abcdef")
	return t
}

// utc puts a loaded task's times in UTC so it compares with what was written.
func utc(t engine.Task) engine.Task {
	for _, at := range []*time.Time{&t.CreatedAt, &t.RunAt, &t.StartedAt, &t.FinishedAt, &t.UpdatedAt, &t.LeaseUntil, &t.CompleteBy} {
		*at = at.UTC()
	}
	return t
}

func load(t *testing.T, pool *pgxpool.Pool, task engine.Task) engine.Task {
	t.Helper()
	got, _, err := view.Load(t.Context(), pool, task.Namespace, task.ID)
	require.NoError(t, err)
	return utc(got)
}

// A task's trace context comes back from the view as it went in: W3C
// headers, and any other text a caller sent.
func TestTraceContextsRoundTrip(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, _ := newMaterializer(t, pool, nil)
	contexts := []map[string]string{
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"},
		{"baggage": "user=ünïcode", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{"x": `a "quoted" \ back`, "tab\t": "line\nbreak", "": "\x7f"},
	}
	var tasks []engine.Task
	for _, tc := range contexts {
		task := queued("ns")
		task.TraceContext = tc
		tasks = append(tasks, task)
		m.Add(view.Entry{Partition: 1, Offset: int64(len(tasks)), Task: task})
	}
	require.NoError(t, m.Flush(t.Context()))
	for i, task := range tasks {
		require.Equal(t, contexts[i], load(t, pool, task).TraceContext)
	}
}

// Every column comes back as it was written: NULLs apart from empty values,
// times to the microsecond, and rows larger than one of COPY's messages.
func TestEveryColumnRoundTrips(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, _ := newMaterializer(t, pool, nil)

	big := queued("ns")
	big.Payload = make([]byte, 200<<10)
	for i := range big.Payload {
		big.Payload[i] = byte(i * 7)
	}
	big.Priority, big.TimedOut, big.Result = -5, true, []byte{}
	big.Status, big.Attempt, big.CompleteBy, big.CompletionSecret = store.Waiting, 2, now().Add(time.Hour), []byte{0, 1, 2}
	big.Outcome, big.Error, big.ErrorCode, big.WorkerID = "später", "it \"failed\"\n", "E42", "w-ü"
	big.Settings.Backoff.Multiplier = 0.125

	lean := running(queued("ns"))
	lean.Payload, lean.Result, lean.TraceContext, lean.IdempotencyKey, lean.Origin = []byte("x"), nil, nil, "", ""
	lean.Settings = store.Settings{}

	m.Add(view.Entry{Partition: 2, Offset: 1 << 40, Task: big}, view.Entry{Partition: 3, Offset: 7, Task: lean})
	require.NoError(t, m.Flush(t.Context()))
	require.Equal(t, big, load(t, pool, big))
	require.Equal(t, lean, load(t, pool, lean))
}

func TestRowsMoveForwardAndKeepPayloadAndResult(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, flushes := newMaterializer(t, pool, nil)
	ctx := t.Context()

	created := queued("ns")
	started := running(created)
	// Created and started within one window: one row, with the payload of
	// the first and the state of the second.
	m.Add(view.Entry{Partition: 1, Offset: 10, CmdOffset: 4, Task: created}, view.Entry{Partition: 1, Offset: 11, CmdOffset: 5, Task: started})
	require.NoError(t, m.Flush(ctx))
	got := load(t, pool, created)
	want := started
	want.Payload = created.Payload
	require.Equal(t, want, got)
	require.Equal(t, map[int32]int64{1: 11}, flushes.get())

	// An older state (a previous owner's late flush) never overwrites.
	m.Add(view.Entry{Partition: 1, Offset: 10, CmdOffset: 4, Task: created})
	require.NoError(t, m.Flush(ctx))
	require.Equal(t, want, load(t, pool, created))

	// The final state has a result and no payload: the payload stays.
	done := started
	done.Status, done.Result, done.Outcome, done.FinishedAt, done.LeaseUntil = store.Completed, []byte(`"ok"`), "sent", now(), time.Time{}
	m.Add(view.Entry{Partition: 1, Offset: 12, CmdOffset: 5, Task: done})
	require.NoError(t, m.Flush(ctx))
	want = done
	want.Payload = created.Payload
	require.Equal(t, want, load(t, pool, created))

	// A later state without a result keeps the stored one.
	later := done
	later.Result, later.UpdatedAt = nil, now()
	m.Add(view.Entry{Partition: 1, Offset: 13, CmdOffset: 6, Task: later})
	require.NoError(t, m.Flush(ctx))
	want.UpdatedAt = later.UpdatedAt
	require.Equal(t, want, load(t, pool, created))
	require.Equal(t, map[int32]int64{1: 13}, flushes.get())
	require.Zero(t, m.Lag())
}

func TestOffsetsOnlyMoveForward(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, _ := newMaterializer(t, pool, nil)
	ctx := t.Context()

	events, commands, err := view.Offsets(ctx, pool, 2)
	require.NoError(t, err)
	require.Equal(t, [2]int64{0, 0}, [2]int64{events, commands})

	// The last record of partition 2 is a rejected invocation: no row,
	// but the offsets pass it.
	rejected := engine.Task{ID: uuid.New(), Namespace: "ns", Action: "missing", Outcome: engine.RejectNotFound, CreatedAt: now(), UpdatedAt: now()}
	m.Add(view.Entry{Partition: 2, Offset: 19, CmdOffset: 6, Task: queued("ns")}, view.Entry{Partition: 2, Offset: 20, CmdOffset: 7, Task: rejected},
		view.Entry{Partition: 3, Offset: 4, CmdOffset: 2, Task: queued("ns")})
	require.NoError(t, m.Flush(ctx))
	events, commands, err = view.Offsets(ctx, pool, 2)
	require.NoError(t, err)
	require.Equal(t, [2]int64{21, 7}, [2]int64{events, commands})
	found, err := view.Existing(ctx, pool, []uuid.UUID{rejected.ID})
	require.NoError(t, err)
	require.Empty(t, found)

	// States an earlier owner buffered land, but the offsets stay.
	m.Add(view.Entry{Partition: 2, Offset: 5, CmdOffset: 2, Task: queued("ns")})
	require.NoError(t, m.Flush(ctx))
	events, commands, err = view.Offsets(ctx, pool, 2)
	require.NoError(t, err)
	require.Equal(t, [2]int64{21, 7}, [2]int64{events, commands})
	events, commands, err = view.Offsets(ctx, pool, 3)
	require.NoError(t, err)
	require.Equal(t, [2]int64{5, 2}, [2]int64{events, commands})
}

func TestFlushOfTenThousandTasksIsOneTransaction(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, flushes := newMaterializer(t, pool, nil)
	const n = 10_000
	entries := make([]view.Entry, n)
	for i := range entries {
		entries[i] = view.Entry{Partition: int32(i % 4), Offset: int64(i), CmdOffset: int64(i / 2), Task: queued("ns")}
	}
	m.Add(entries...)
	require.Equal(t, int64(n), m.Lag())
	start := time.Now()
	require.NoError(t, m.Flush(t.Context()))
	t.Logf("flush of %d tasks took %v", n, time.Since(start))

	// Every row and every offset has the same writing transaction.
	var rows, xids int
	require.NoError(t, pool.QueryRow(t.Context(), `
SELECT count(*), count(DISTINCT xmin::text) FROM (SELECT xmin FROM tasks UNION ALL SELECT xmin FROM view_offsets) x`).Scan(&rows, &xids))
	require.Equal(t, n+4, rows)
	require.Equal(t, 1, xids)
	require.Equal(t, map[int32]int64{0: n - 4, 1: n - 3, 2: n - 2, 3: n - 1}, flushes.get())
	require.Zero(t, m.Lag())
}

// logLines counts the warnings and infos logged and keeps the errors' and
// infos' messages and attributes.
type logLines struct {
	mu          sync.Mutex
	warn, infos int
	errors      []logged
	infoLines   []logged
}

// logged is one log line's message and attributes.
type logged struct {
	msg   string
	attrs map[string]any
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := logged{msg: r.Message, attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		line.attrs[a.Key] = a.Value.Any()
		return true
	})
	switch r.Level {
	case slog.LevelWarn:
		l.warn++
	case slog.LevelInfo:
		l.infos++
		l.infoLines = append(l.infoLines, line)
	case slog.LevelError:
		l.errors = append(l.errors, line)
	}
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }
func (l *logLines) counts() (int, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.warn, l.infos
}

func (l *logLines) errorLines() []logged {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errors)
}

func (l *logLines) infoMessages() []logged {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.infoLines)
}

func TestBufferedStatesLandAfterPostgresComesBack(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, flushes, lines, reader := observed(t, pool)
	run(t, m)

	restore := refuse(t, pool)
	first, second := queued("ns"), queued("ns")
	m.Add(view.Entry{Partition: 0, Offset: 1, CmdOffset: 1, Task: first})
	require.Eventually(t, func() bool { w, _ := lines.counts(); return w == 1 }, 10*time.Second, 10*time.Millisecond)
	m.Add(view.Entry{Partition: 0, Offset: 2, CmdOffset: 2, Task: second})
	require.Equal(t, int64(2), m.Lag())
	require.Equal(t, int64(2), collect(t, reader)["flo.dispatcher.view.lag"])

	restore()
	require.Eventually(t, func() bool { return m.Lag() == 0 }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, first, load(t, pool, first))
	require.Equal(t, second, load(t, pool, second))
	require.Equal(t, map[int32]int64{0: 2}, flushes.get())
	warns, infos := lines.counts()
	require.Equal(t, [2]int{1, 1}, [2]int{warns, infos}, "one warning for the failure streak, one line for the recovery")
	require.Equal(t, map[string]int64{"flo.dispatcher.view.lag": 0, "flo.dispatcher.view.rows_written": 2}, collect(t, reader))
}

// refuse makes pool's database refuse connections and ends its sessions,
// as if Postgres were down, until the returned function is called.
func refuse(t *testing.T, pool *pgxpool.Pool) func() {
	t.Helper()
	admin, err := pgx.Connect(t.Context(), harness.Postgres(t).URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	name := pool.Config().ConnConfig.Database
	_, err = admin.Exec(t.Context(), `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` WITH ALLOW_CONNECTIONS false`)
	require.NoError(t, err)
	_, err = admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name)
	require.NoError(t, err)
	return func() {
		_, err := admin.Exec(t.Context(), `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` WITH ALLOW_CONNECTIONS true`)
		require.NoError(t, err)
	}
}

// Postgres refusing connections is no row's fault: the whole batch waits,
// no row is isolated or set aside.
func TestFlushAfterAFailedFlushWritesEverything(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, flushes, lines, reader := observed(t, pool)
	restore := refuse(t, pool)
	first, second := queued("ns"), queued("ns")
	m.Add(view.Entry{Partition: 5, Offset: 7, CmdOffset: 3, Task: first})
	err := m.Flush(t.Context())
	require.Error(t, err)
	require.NotContains(t, err.Error(), "a write of no task fails too", "taken for a row's fault")
	require.Empty(t, lines.errorLines())
	require.Equal(t, int64(1), m.Lag())
	m.Add(view.Entry{Partition: 5, Offset: 8, CmdOffset: 4, Task: second})
	restore()
	require.NoError(t, m.Flush(t.Context()))
	require.Empty(t, lines.errorLines())
	require.Equal(t, map[string]int64{"flo.dispatcher.view.rows_written": 2}, collect(t, reader))
	require.Zero(t, m.Lag())
	require.Equal(t, first, load(t, pool, first))
	require.Equal(t, second, load(t, pool, second))
	events, commands, err := view.Offsets(t.Context(), pool, 5)
	require.NoError(t, err)
	require.Equal(t, [2]int64{9, 4}, [2]int64{events, commands})
	require.Equal(t, map[int32]int64{5: 8}, flushes.get())
}

// collect reads the integer metrics' values (of their only data point).
func collect(t *testing.T, reader sdkmetric.Reader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Gauge[int64]:
				out[mt.Name] = d.DataPoints[0].Value
			case metricdata.Sum[int64]:
				out[mt.Name] = d.DataPoints[0].Value
			}
		}
	}
	return out
}

func TestLoadLiveExistingAndLoad(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, _ := newMaterializer(t, pool, nil)
	ctx := t.Context()

	// Tasks whose creation the view missed: states with their payloads.
	busy := running(queued("ns"))
	busy.Payload = []byte("busy")
	waiting := running(queued("ns"))
	waiting.Status, waiting.CompleteBy, waiting.Payload = store.Waiting, now().Add(time.Hour), []byte("waiting")
	noLease := waiting
	noLease.LeaseUntil = time.Time{}
	plain := queued("ns")
	plain.TraceContext, plain.Origin, plain.IdempotencyKey = nil, "", ""
	live := []engine.Task{queued("ns"), busy, waiting, plain}
	final := running(queued("ns"))
	final.Status, final.Error, final.ErrorCode, final.TimedOut, final.FinishedAt = store.DeadLettered, "boom", "E42", true, now()
	final.Payload = []byte("p")
	var entries []view.Entry
	for i, task := range live {
		entries = append(entries, view.Entry{Partition: 1, Offset: int64(i), Task: task})
	}
	entries = append(entries, view.Entry{Partition: 1, Offset: 10, Task: final}, view.Entry{Partition: 2, Offset: 10, Task: queued("ns")})
	m.Add(entries...)
	require.NoError(t, m.Flush(ctx))

	loaded, cold := loadLive(t, pool, 1, engine.Limits{}, now())
	require.Zero(t, cold)
	got := make(map[uuid.UUID]engine.Task, len(loaded))
	for _, task := range loaded {
		got[task.ID] = utc(task)
	}
	// A lease is kept for running tasks only.
	live[2] = noLease
	require.Len(t, got, len(live))
	for _, task := range live {
		require.Equal(t, task, got[task.ID])
	}

	// A final state has no lease, whatever the state said.
	final.LeaseUntil = time.Time{}
	require.Equal(t, final, load(t, pool, final))
	_, viewed, err := view.Load(ctx, pool, final.Namespace, final.ID)
	require.NoError(t, err)
	require.Equal(t, int64(10), viewed, "the row comes with the last offset the view held of its partition")
	_, _, err = view.Load(ctx, pool, "other", final.ID)
	require.ErrorIs(t, err, pg.ErrNotFound)

	missing := uuid.New()
	found, err := view.Existing(ctx, pool, []uuid.UUID{final.ID, live[0].ID, missing})
	require.NoError(t, err)
	require.Equal(t, map[uuid.UUID]bool{final.ID: true, live[0].ID: true}, found)
}

func TestOwners(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	ctx := t.Context()
	require.NoError(t, view.SetOwners(ctx, pool, "r1", "10.0.0.1:9090", "m1", []int32{0, 1, 2}))
	require.NoError(t, view.SetOwners(ctx, pool, "r2", "10.0.0.2:9090", "m2", []int32{2, 3}))
	owners, err := view.Owners(ctx, pool)
	require.NoError(t, err)
	type owner struct {
		partition                int32
		replica, address, member string
	}
	var got []owner
	for _, o := range owners {
		require.False(t, o.UpdatedAt.IsZero())
		got = append(got, owner{o.Partition, o.Replica, o.Address, o.Member})
	}
	require.Equal(t, []owner{
		{0, "r1", "10.0.0.1:9090", "m1"}, {1, "r1", "10.0.0.1:9090", "m1"},
		{2, "r2", "10.0.0.2:9090", "m2"}, {3, "r2", "10.0.0.2:9090", "m2"},
	}, got)
}

// Run holds a live task's state back, so a task that ends soon after it was
// created is written once, final; the offsets and onFlushed stay before the
// held state until then.
func TestRunWritesAShortLivedTaskOnceFinal(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, flushes, _, reader := observed(t, pool)
	run(t, m)
	ctx := t.Context()

	created := queued("ns")
	other := queued("ns")
	other.Status, other.Outcome, other.FinishedAt = store.Completed, "done", now()
	m.Add(view.Entry{Partition: 0, Offset: 10, CmdOffset: 4, Task: created})
	m.Add(view.Entry{Partition: 0, Offset: 11, CmdOffset: 5, Task: other})
	// Once the final task at 11 is written, the queued one at 10 is still
	// held: no row, and the partition's offsets stop at 10.
	require.Eventually(t, func() bool { return flushes.get()[0] == 9 }, 10*time.Second, 5*time.Millisecond)
	found, err := view.Existing(ctx, pool, []uuid.UUID{created.ID, other.ID})
	require.NoError(t, err)
	require.Equal(t, map[uuid.UUID]bool{other.ID: true}, found)
	events, commands, err := view.Offsets(ctx, pool, 0)
	require.NoError(t, err)
	require.Equal(t, [2]int64{10, 0}, [2]int64{events, commands})

	done := running(created)
	done.Status, done.Result, done.Outcome, done.FinishedAt, done.LeaseUntil = store.Completed, []byte(`"ok"`), "sent", now(), time.Time{}
	m.Add(view.Entry{Partition: 0, Offset: 12, CmdOffset: 6, Task: done})
	require.Eventually(t, func() bool { return flushes.get()[0] == 12 }, 10*time.Second, 5*time.Millisecond)
	want := done
	want.Payload = created.Payload
	require.Equal(t, want, load(t, pool, created))
	events, commands, err = view.Offsets(ctx, pool, 0)
	require.NoError(t, err)
	require.Equal(t, [2]int64{13, 6}, [2]int64{events, commands})
	require.Equal(t, map[string]int64{"flo.dispatcher.view.lag": 0, "flo.dispatcher.view.rows_written": 2}, collect(t, reader))

	// A live state no newer one replaces is written once it is liveHold old.
	late := queued("ns")
	m.Add(view.Entry{Partition: 0, Offset: 13, CmdOffset: 7, Task: late})
	require.Eventually(t, func() bool { return flushes.get()[0] == 13 }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, late, load(t, pool, late))
}

// A new owner reads payloads only as far as its limits let it hold them: of
// queued tasks due within the horizon, in hand-out order, up to the bound.
// The rest come marked as left in the view.
func TestLoadLiveReadsPayloadsWithinTheLimits(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, _ := newMaterializer(t, pool, nil)
	ctx := t.Context()
	at := now()

	task := func(priority int32, due time.Duration) engine.Task {
		q := queued("ns")
		q.Priority, q.RunAt = priority, at.Add(due)
		return q
	}
	first := task(5, 0)                    // the highest priority goes out first
	second := task(1, -time.Second)        // then the one due first
	third := task(1, 0)                    // past a bound of two
	soon := task(9, time.Minute)           // not due yet: after every due one
	far := task(9, 2*time.Hour)            // past the horizon
	busy := running(task(9, -time.Second)) // handed out already
	busy.Payload = []byte(`{"to":"b"}`)    // as the view has it from its creation
	empty := task(0, 0)
	empty.Payload = []byte{}
	size := int64(len(first.Payload))
	all := []engine.Task{first, second, third, soon, far, busy, empty}
	for i, task := range all {
		m.Add(view.Entry{Partition: 3, Offset: int64(i), Task: task})
	}
	require.NoError(t, m.Flush(ctx))

	load := func(limits engine.Limits) map[uuid.UUID]engine.Task {
		t.Helper()
		loaded, cold := loadLive(t, pool, 3, limits, at)
		require.Zero(t, cold)
		require.Len(t, loaded, len(all))
		got := map[uuid.UUID]engine.Task{}
		for _, task := range loaded {
			got[task.ID] = task
		}
		return got
	}
	check := func(got map[uuid.UUID]engine.Task, kept ...engine.Task) {
		t.Helper()
		for _, task := range all {
			g := got[task.ID]
			switch {
			case slices.ContainsFunc(kept, func(k engine.Task) bool { return k.ID == task.ID }):
				require.False(t, g.PayloadOut, "payload of %s read", task.ID)
				require.Equal(t, task.Payload, g.Payload)
			case len(task.Payload) == 0:
				require.False(t, g.PayloadOut, "an empty payload is not left out")
				require.Empty(t, g.Payload)
			default:
				require.True(t, g.PayloadOut, "payload of %s left in the view", task.ID)
				require.Empty(t, g.Payload)
			}
		}
	}

	check(load(engine.Limits{}), first, second, third, soon, far, busy)
	check(load(engine.Limits{PayloadBytes: 2 * size, Horizon: time.Hour}), first, second)
	check(load(engine.Limits{PayloadBytes: 4 * size, Horizon: time.Hour}), first, second, third, soon)
	check(load(engine.Limits{Horizon: time.Hour}), first, second, third, soon)

	// Past a bound of queued tasks, the rest in hand-out order stay in the
	// view: only their count is read.
	held, cold := loadLive(t, pool, 3, engine.Limits{QueuedTasks: 2}, at)
	ids := func(tasks []engine.Task) []uuid.UUID {
		var out []uuid.UUID
		for _, task := range tasks {
			out = append(out, task.ID)
		}
		return out
	}
	require.ElementsMatch(t, []uuid.UUID{first.ID, second.ID, busy.ID}, ids(held))
	require.Len(t, cold, 1)
	send := cold[[2]string{"ns", "send"}]
	require.Equal(t, 4, send.N, "third, empty, soon and far")
	require.WithinDuration(t, soon.RunAt, send.Due, time.Microsecond, "its delayed tasks come due from soon")
	require.WithinDuration(t, far.RunAt, send.DueLast, time.Microsecond, "to far")

	// Read back, they come whole in hand-out order: the ready ones by
	// priority, due time and creation, then the delayed ones soonest due,
	// leaving out those the owner held when the read began.
	w := &engine.Warming{N: 10, Held: []uuid.UUID{first.ID, second.ID, busy.ID}, Now: at}
	read, err := view.LoadCold(ctx, pool, 3, w)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{third.ID, empty.ID, soon.ID, far.ID}, ids(read))
	require.Equal(t, third.Payload, read[0].Payload, "read back whole")
	require.Equal(t, far.Payload, read[3].Payload, "read back whole")
	w.N = 3
	read, err = view.LoadCold(ctx, pool, 3, w)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{third.ID, empty.ID, soon.ID}, ids(read), "as many as asked")
	w.N, w.Held = 1, append(w.Held, third.ID, empty.ID)
	read, err = view.LoadCold(ctx, pool, 3, w)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{soon.ID}, ids(read), "the ready ones all held: the delayed ones next")
	read, err = view.LoadCold(ctx, pool, 4, w)
	require.NoError(t, err)
	require.Empty(t, read, "only the partition's own")
	check(load(engine.Limits{PayloadBytes: 5 * size}), first, second, third, soon, far)
	check(load(engine.Limits{PayloadBytes: 2*size - 1}), first)
}

// loadLive collects what LoadLive reads: the tasks to hold, and what it
// left in the view cold of each queue.
func loadLive(t *testing.T, db store.DB, partition int32, limits engine.Limits, now time.Time) (held []engine.Task, cold map[[2]string]view.Cold) {
	t.Helper()
	cold, err := view.LoadLive(t.Context(), db, partition, limits, now, func(task engine.Task) {
		held = append(held, task)
	})
	require.NoError(t, err)
	return held, cold
}

// A queue's own read back takes its next ready cold tasks in hand-out
// order, none of another queue's, none of those held, and no delayed one;
// a new owner counts each queue's cold tasks.
func TestColdTasksOfOneQueue(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, _ := newMaterializer(t, pool, nil)
	ctx := t.Context()
	at := now()
	task := func(action string, priority int32, due time.Duration) engine.Task {
		q := queued("ns")
		q.Action, q.Priority, q.RunAt = action, priority, at.Add(due)
		return q
	}
	low := task("send", 1, -time.Second)
	high := task("send", 5, 0)
	held := task("send", 9, 0)
	later := task("send", 9, time.Minute)
	other := task("mail", 9, -time.Minute)
	for i, task := range []engine.Task{low, high, held, later, other} {
		m.Add(view.Entry{Partition: 5, Offset: int64(i), Task: task})
	}
	m.Add(view.Entry{Partition: 6, Offset: 0, Task: task("send", 9, 0)})
	require.NoError(t, m.Flush(ctx))

	w := &engine.Warming{N: 10, Namespace: "ns", Action: "send", Held: []uuid.UUID{held.ID}, Now: at}
	read, err := view.LoadCold(ctx, pool, 5, w)
	require.NoError(t, err)
	var got []uuid.UUID
	for _, task := range read {
		got = append(got, task.ID)
		require.Equal(t, "send", task.Action)
		require.NotEmpty(t, task.Payload, "read back whole")
	}
	require.Equal(t, []uuid.UUID{high.ID, low.ID}, got)
	w.N = 1
	read, err = view.LoadCold(ctx, pool, 5, w)
	require.NoError(t, err)
	require.Len(t, read, 1, "as many as asked")
	require.Equal(t, high.ID, read[0].ID)

	// From a place on: the rest of its priority, then the lower ones.
	from := func(task engine.Task) *engine.Place {
		return &engine.Place{Priority: task.Priority, RunAt: task.RunAt, CreatedAt: task.CreatedAt, ID: task.ID}
	}
	w.N, w.From = 10, from(high)
	read, err = view.LoadCold(ctx, pool, 5, w)
	require.NoError(t, err)
	require.Len(t, read, 2, "from high itself on")
	require.Equal(t, []uuid.UUID{high.ID, low.ID}, []uuid.UUID{read[0].ID, read[1].ID})
	w.From = from(low)
	read, err = view.LoadCold(ctx, pool, 5, w)
	require.NoError(t, err)
	require.Len(t, read, 1)
	require.Equal(t, low.ID, read[0].ID)
	after := from(high)
	after.RunAt = after.RunAt.Add(time.Microsecond)
	w.From = after
	read, err = view.LoadCold(ctx, pool, 5, w)
	require.NoError(t, err)
	require.Len(t, read, 1, "past high, in its priority")
	require.Equal(t, low.ID, read[0].ID)

	loaded, cold := loadLive(t, pool, 5, engine.Limits{QueuedTasks: 2}, at)
	require.Len(t, loaded, 2)
	require.Len(t, cold, 1, "other is held")
	send := cold[[2]string{"ns", "send"}]
	require.Equal(t, 3, send.N, "held is held; the rest of send is cold")
	require.WithinDuration(t, later.RunAt, send.Due, time.Microsecond, "later is send's one delayed task")
	require.WithinDuration(t, later.RunAt, send.DueLast, time.Microsecond)

	// Before a place: the higher priorities, then the start of its own;
	// none of another queue's, none delayed.
	w.From, w.Held = nil, nil
	w.N, w.Before = 10, from(held)
	read, err = view.LoadCold(ctx, pool, 5, w)
	require.NoError(t, err)
	require.Empty(t, read, "nothing ready comes before held")
	w.Before = from(low)
	read, err = view.LoadCold(ctx, pool, 5, w)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{held.ID, high.ID}, []uuid.UUID{read[0].ID, read[1].ID})
	require.Len(t, read, 2, "low itself is not before low")
	w.N = 1
	read, err = view.LoadCold(ctx, pool, 5, w)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{held.ID}, []uuid.UUID{read[0].ID}, "as many as asked")
	w.N, w.Before = 10, from(high)
	read, err = view.LoadCold(ctx, pool, 5, w)
	require.NoError(t, err)
	require.Len(t, read, 1, "only the higher priority: nothing of its own comes before high")
	require.Equal(t, held.ID, read[0].ID)
}
