package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/localbroker"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

var quiet = slog.New(slog.DiscardHandler)

type env struct {
	pool     *pgxpool.Pool
	broker   *localbroker.Broker
	producer *kgo.Client
}

func setup(t *testing.T) env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pg.Connect(ctx, harness.NewDatabase(t), "svc", 8, quiet)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pg.Migrate(ctx, pool, "svc", migrations(3)))
	broker := harness.NewBroker(t)
	producer, err := kafka.NewClient(broker.Kafka())
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	require.NoError(t, kafka.EnsureTopics(ctx, producer, 4, "events", "other"))
	return env{pool: pool, broker: broker, producer: producer}
}

// migrations are the first n of the outbox's migrations, as a service
// holds them.
func migrations(n int) fstest.MapFS {
	fs := fstest.MapFS{"0001_outbox.sql": {Data: []byte("-- +goose Up\n" + outbox.Migration)}}
	if n > 1 {
		fs["0002_outbox_batches.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\n" + outbox.BatchMigration + "\n-- +goose Down\n" + outbox.BatchMigrationDown)}
	}
	if n > 2 {
		fs["0003_outbox_dead.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\n" + outbox.DeadMigration + "\n-- +goose Down\n" + outbox.DeadMigrationDown)}
	}
	return fs
}

// startRelay runs a relay until the test ends.
func startRelay(t *testing.T, e env) *outbox.Relay {
	t.Helper()
	r := outbox.NewRelay(e.pool, e.producer, quiet)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

// reader collects every record of topic from the start.
type reader struct {
	mu      sync.Mutex
	records []*kgo.Record
}

func read(t *testing.T, e env, topics ...string) *reader {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.broker.Addrs()...), kgo.ConsumeTopics(topics...), kgo.FetchMaxWait(200*time.Millisecond))
	require.NoError(t, err)
	rd := &reader{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			rd.mu.Lock()
			rd.records = append(rd.records, fs.Records()...)
			rd.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return rd
}

func (rd *reader) values() []string {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	out := make([]string, len(rd.records))
	for i, r := range rd.records {
		out[i] = string(r.Value)
	}
	return out
}

func write(t *testing.T, e env, ctx context.Context, records ...outbox.Record) {
	t.Helper()
	require.NoError(t, pg.InTx(ctx, e.pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, records...) }))
}

// outboxRecords counts the records the outbox holds, and its rows.
func outboxRecords(t *testing.T, e env) (records, rows int) {
	t.Helper()
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT COALESCE(sum(cardinality(topic)), 0), count(*) FROM outbox`).Scan(&records, &rows))
	return records, rows
}

func values(prefix string, from, to int) []outbox.Record {
	var out []outbox.Record
	for i := from; i < to; i++ {
		out = append(out, outbox.Record{Topic: "events", Key: []byte("one-key"), Value: fmt.Appendf(nil, "%s%04d", prefix, i), Headers: map[string]string{}})
	}
	return out
}

func strs(rs []outbox.Record) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r.Value)
	}
	return out
}

func TestRelayPublishesInOrderWithHeaders(t *testing.T) {
	t.Parallel()
	e := setup(t)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0xaa, 1},
		SpanID:     trace.SpanID{0xbb, 2},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	many := values("m", 0, 20)
	many[1].Headers = nil
	few := []outbox.Record{
		{Topic: "events", Key: []byte("one-key"), Value: []byte("traced")},
		{Topic: "events", Key: []byte("one-key"), Value: []byte("explicit"), Headers: map[string]string{"b": "2", "a": "1"}},
		{Topic: "other", Key: nil, Value: nil},
	}
	write(t, e, ctx, many...)
	write(t, e, ctx, few...)
	records, rows := outboxRecords(t, e)
	require.Equal(t, 23, records)
	require.Equal(t, 2, rows, "a row per write")

	rd := read(t, e, "events", "other")
	r := startRelay(t, e)
	r.Notify()
	r.Notify() // never blocks

	want := append(strs(many), "traced", "explicit")
	require.Eventually(t, func() bool { return len(rd.values()) == len(want)+1 }, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { _, rows := outboxRecords(t, e); return rows == 0 }, 10*time.Second, 10*time.Millisecond)

	rd.mu.Lock()
	defer rd.mu.Unlock()
	var got []string
	byValue := map[string]*kgo.Record{}
	for _, rec := range rd.records {
		if rec.Topic == "events" {
			got = append(got, string(rec.Value))
			byValue[string(rec.Value)] = rec
		} else {
			require.Nil(t, rec.Key)
			require.Empty(t, rec.Value)
			require.Equal(t, sc.TraceID(), trace.SpanContextFromContext(kafka.ExtractTrace(context.Background(), rec)).TraceID())
		}
	}
	require.Equal(t, want, got)
	require.Empty(t, byValue["m0000"].Headers, "explicit empty headers stay empty")
	copied := kafka.ExtractTrace(context.Background(), byValue["m0001"])
	require.Equal(t, sc.TraceID(), trace.SpanContextFromContext(copied).TraceID(), "nil headers get the trace")
	traced := kafka.ExtractTrace(context.Background(), byValue["traced"])
	require.Equal(t, sc.TraceID(), trace.SpanContextFromContext(traced).TraceID())
	require.Equal(t, []kgo.RecordHeader{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")}}, byValue["explicit"].Headers)
}

func TestRollbackWritesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	boom := errors.New("boom")
	err := pg.InTx(ctx, e.pool, func(tx pgx.Tx) error {
		if err := outbox.Write(ctx, tx, values("r", 0, 3)...); err != nil {
			return err
		}
		if err := outbox.Write(ctx, tx, values("r", 3, 30)...); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	records, _ := outboxRecords(t, e)
	require.Zero(t, records)
	require.NoError(t, pg.InTx(ctx, e.pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx) }), "nothing to write is fine")
	err = pg.InTx(ctx, e.pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, outbox.Record{Value: []byte("x")}) })
	require.ErrorContains(t, err, "no topic")
}

func TestRelaySurvivesBrokerRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	rd := read(t, e, "events")
	r := startRelay(t, e)

	first := values("a", 0, 50)
	write(t, e, ctx, first...)
	r.Notify()
	require.Eventually(t, func() bool { return len(rd.values()) == len(first) }, 20*time.Second, 10*time.Millisecond)

	e.broker.Close()
	second := values("b", 0, 50)
	for i := range 5 {
		write(t, e, ctx, second[i*10:(i+1)*10]...)
		r.Notify()
	}
	require.Never(t, func() bool { records, _ := outboxRecords(t, e); return records < len(second) }, 300*time.Millisecond, 20*time.Millisecond,
		"nothing is deleted while the broker is down")
	require.NoError(t, e.broker.Restart())

	want := append(strs(first), strs(second)...)
	require.Eventually(t, func() bool { return len(rd.values()) >= len(want) }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { _, rows := outboxRecords(t, e); return rows == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, want, rd.values())
}

func TestConcurrentRelaysKeepOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	rd := read(t, e, "events")
	relays := []*outbox.Relay{startRelay(t, e), startRelay(t, e), startRelay(t, e)}

	var want []string
	for i := range 40 {
		batch := values("c", i*25, (i+1)*25)
		write(t, e, ctx, batch...)
		want = append(want, strs(batch)...)
		relays[i%len(relays)].Notify()
	}
	require.Eventually(t, func() bool { return len(rd.values()) >= len(want) }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, want, rd.values())
}

func TestFlushWaitsUntilPublished(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	rd := read(t, e, "events")
	r := startRelay(t, e)

	drained, err := r.Flush(ctx, 10*time.Second)
	require.NoError(t, err)
	require.True(t, drained, "an empty outbox is drained at once")

	want := values("f", 0, 30)
	write(t, e, ctx, want...)
	drained, err = r.Flush(ctx, 20*time.Second)
	require.NoError(t, err)
	require.True(t, drained)
	records, _ := outboxRecords(t, e)
	require.Zero(t, records)
	require.Eventually(t, func() bool { return len(rd.values()) == len(want) }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, strs(want), rd.values())
}

func TestFlushGivesUpAfterTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	r := startRelay(t, e)
	e.broker.Close()
	write(t, e, ctx, values("g", 0, 5)...)

	start := time.Now()
	drained, err := r.Flush(ctx, 300*time.Millisecond)
	require.NoError(t, err)
	require.False(t, drained, "nothing can be published while the broker is down")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	records, _ := outboxRecords(t, e)
	require.Equal(t, 5, records, "records stay for the next relay")
}

// A service that had the outbox of a record per row keeps the records it
// had not published when BatchMigration runs, and the relay publishes them
// before the rows written after it.
func TestBatchMigrationKeepsUnpublishedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pg.Connect(ctx, harness.NewDatabase(t), "svc", 4, quiet)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pg.Migrate(ctx, pool, "svc", migrations(1)))
	_, err = pool.Exec(ctx, `
		INSERT INTO outbox (topic, key, value, headers) VALUES
			('events', 'k', 'old-1', '{"h":"1"}'),
			('events', NULL, 'old-2', '{}')`)
	require.NoError(t, err)
	require.NoError(t, pg.Migrate(ctx, pool, "svc", migrations(2)))

	broker := harness.NewBroker(t)
	producer, err := kafka.NewClient(broker.Kafka())
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	require.NoError(t, kafka.EnsureTopics(ctx, producer, 1, "events"))
	e := env{pool: pool, broker: broker, producer: producer}
	write(t, e, ctx, values("new", 0, 3)...)
	rd := read(t, e, "events")
	startRelay(t, e).Notify()

	want := []string{"old-1", "old-2", "new0000", "new0001", "new0002"}
	require.Eventually(t, func() bool { return len(rd.values()) >= len(want) }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, want, rd.values())
	rd.mu.Lock()
	defer rd.mu.Unlock()
	require.Equal(t, "k", string(rd.records[0].Key))
	require.Equal(t, []kgo.RecordHeader{{Key: "h", Value: []byte("1")}}, rd.records[0].Headers)
	require.Nil(t, rd.records[1].Key)
}

// BatchMigrationDown turns every record back into a row of its own, in order.
func TestBatchMigrationDownKeepsEveryRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pg.Connect(ctx, harness.NewDatabase(t), "svc", 4, quiet)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pg.Migrate(ctx, pool, "svc", migrations(2)))
	e := env{pool: pool}
	first := values("a", 0, 3)
	first[1].Headers = map[string]string{"h": "1"}
	write(t, e, ctx, first...)
	write(t, e, ctx, values("b", 0, 2)...)
	require.NoError(t, pg.InTx(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, outbox.BatchMigrationDown)
		return err
	}))

	rows, err := pool.Query(ctx, `SELECT topic, convert_from(key, 'UTF8'), convert_from(value, 'UTF8'), headers->>'h' FROM outbox ORDER BY id`)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var topic, key, value string
		var header *string
		require.NoError(t, rows.Scan(&topic, &key, &value, &header))
		require.Equal(t, "events", topic)
		require.Equal(t, "one-key", key)
		if header != nil {
			value += " h=" + *header
		}
		got = append(got, value)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"a0000", "a0001 h=1", "a0002", "b0000", "b0001"}, got)
}

func TestCheckMigrations(t *testing.T) {
	t.Parallel()
	const first, batches, dead = "0001_outbox.sql", "0002_outbox_batches.sql", "0003_outbox_dead.sql"
	require.NoError(t, outbox.CheckMigrations(migrations(3), first, batches, dead))
	require.ErrorContains(t, outbox.CheckMigrations(migrations(1), first, batches, dead), batches)
	require.ErrorContains(t, outbox.CheckMigrations(migrations(2), first, batches, dead), dead)
	fs := migrations(3)
	fs[batches].Data = []byte("-- +goose Up\n" + outbox.BatchMigration)
	require.ErrorContains(t, outbox.CheckMigrations(fs, first, batches, dead), "does not hold the library's SQL")
}
