package tally_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/pg"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	"github.com/razorbill/flo/services/registry/internal/store"
	"github.com/razorbill/flo/services/registry/internal/tally"
	"github.com/razorbill/flo/services/registry/migrations"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

func TestOutcomeOf(t *testing.T) {
	t.Parallel()
	want := map[eventsv1.TaskEventType]tally.Outcome{
		eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED:       tally.Succeeded,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED:          tally.Failed,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_RETRY_SCHEDULED: tally.Failed,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED:   tally.Failed,
	}
	for v := range eventsv1.TaskEventType_name {
		typ := eventsv1.TaskEventType(v)
		require.Equal(t, want[typ], tally.OutcomeOf(typ), typ.String())
	}
}

func TestAggregate(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	events := []tally.Event{
		{Outcome: tally.Succeeded, Namespace: "b", WorkerID: "w", Action: "x", OccurredAt: t0.Add(2 * time.Second)},
		{Outcome: tally.Failed, Namespace: "a", WorkerID: "w", Action: "y", OccurredAt: t0},
		{Outcome: tally.Succeeded, Namespace: "b", WorkerID: "w", Action: "x", OccurredAt: t0},
		{Outcome: tally.Failed, Namespace: "b", WorkerID: "w", Action: "x", OccurredAt: t0.Add(time.Second)},
		{Outcome: tally.Succeeded, Namespace: "a", WorkerID: "v", OccurredAt: t0},
	}
	workers, processes := tally.Aggregate(events)
	require.Equal(t, []store.WorkerCount{
		{Namespace: "a", WorkerID: "v", Completed: 1},
		{Namespace: "a", WorkerID: "w", Failed: 1},
		{Namespace: "b", WorkerID: "w", Completed: 2, Failed: 1},
	}, workers)
	require.Equal(t, []store.ProcessCount{
		{Namespace: "a", WorkerID: "w", Name: "y", Fails: 1, LastRunAt: t0},
		{Namespace: "b", WorkerID: "w", Name: "x", Runs: 2, Fails: 1, LastRunAt: t0.Add(2 * time.Second)},
	}, processes)
}

// fixture is a tally on a fresh registry database holding one worker, ns/w.
type fixture struct {
	pool  *pgxpool.Pool
	tally *tally.Tally
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool, err := pg.Open(t.Context(), harness.NewDatabase(t), "registry", 8, migrations.FS, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(t.Context(), `INSERT INTO workers (namespace, worker_id, worker_type, status, max_concurrency) VALUES ('ns', 'w', 'action', 'active', 1)`)
	require.NoError(t, err)
	return &fixture{pool: pool, tally: runTally(t, pool)}
}

// runTally returns a tally on pool that runs until the test ends.
func runTally(t *testing.T, pool *pgxpool.Pool) *tally.Tally {
	t.Helper()
	tl, err := tally.New(pool, noop.NewMeterProvider().Meter("test"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return tl
}

// records returns records from..to-1 of a partition of the task events
// topic: completions of ns/w's action "send" at even offsets, failures at
// odd ones.
func records(t *testing.T, partition int32, from, to int64) []*kgo.Record {
	t.Helper()
	var out []*kgo.Record
	for o := from; o < to; o++ {
		typ := eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED
		if o%2 == 1 {
			typ = eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED
		}
		v, err := proto.Marshal(&eventsv1.TaskEvent{Type: typ, Namespace: "ns", WorkerId: "w", Action: "send", OccurredAt: timestamppb.Now()})
		require.NoError(t, err)
		out = append(out, &kgo.Record{Topic: kafka.TaskOutcomesTopic, Partition: partition, Offset: o, Value: v})
	}
	return out
}

// counts is what the worker's row and its process say it did.
type counts struct{ completed, failed, runs, fails int64 }

// want is the counts of records at offsets 0..n-1 (of any partitions).
func want(n int64) counts {
	return counts{completed: (n + 1) / 2, failed: n / 2, runs: (n + 1) / 2, fails: n / 2}
}

func (f *fixture) counts(t *testing.T) counts {
	t.Helper()
	w, err := store.GetWorker(t.Context(), f.pool, "ns", "w")
	require.NoError(t, err)
	c := counts{completed: w.TasksCompleted, failed: w.TasksFailed}
	for _, p := range w.Processes {
		if p.Name == "send" {
			c.runs, c.fails = p.RunCount, p.FailCount
		}
	}
	return c
}

func (f *fixture) nextOffset(t *testing.T, partition int32) int64 {
	t.Helper()
	var next int64
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT next_offset FROM tally_offsets WHERE topic = $1 AND partition = $2`,
		kafka.TaskOutcomesTopic, partition).Scan(&next))
	return next
}

// handle applies records from..to-1 of a partition.
func (f *fixture) handle(t *testing.T, partition int32, from, to int64) {
	t.Helper()
	require.NoError(t, f.tally.HandleRecords(t.Context(), records(t, partition, from, to)))
}

// TestRedeliveredRecordsCountOnce applies a batch twice, then batches
// overlapping it (a rebalance after a partial commit, the consumer's
// isolated retries record by record): only records past the stored offset
// count, and an older batch never takes the offset back.
func TestRedeliveredRecordsCountOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.handle(t, 0, 0, 5)
	f.handle(t, 0, 0, 5)
	require.Equal(t, want(5), f.counts(t))
	require.Equal(t, int64(5), f.nextOffset(t, 0))

	f.handle(t, 0, 3, 9)
	require.Equal(t, want(9), f.counts(t))
	for _, r := range records(t, 0, 0, 9) {
		require.NoError(t, f.tally.HandleRecords(t.Context(), []*kgo.Record{r}))
	}
	f.handle(t, 0, 2, 4)
	require.Equal(t, want(9), f.counts(t))
	require.Equal(t, int64(9), f.nextOffset(t, 0))

	f.handle(t, 0, 9, 12)
	require.Equal(t, want(12), f.counts(t))
}

// TestPartitionsCountApart: the same offsets in two partitions are different
// records, each counted once.
func TestPartitionsCountApart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.handle(t, 0, 0, 6)
	f.handle(t, 1, 0, 4)
	f.handle(t, 1, 0, 4)
	require.Equal(t, counts{completed: 5, failed: 5, runs: 5, fails: 5}, f.counts(t))
	require.Equal(t, int64(6), f.nextOffset(t, 0))
	require.Equal(t, int64(4), f.nextOffset(t, 1))
}

// TestPoisonRecordIsReportedAndPassed: an undecodable record comes back as
// kafka.Poison naming it, the records around it are counted, and the stored
// offset passes it, also when it ends the batch.
func TestPoisonRecordIsReportedAndPassed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	recs := records(t, 0, 0, 4)
	recs[1].Value = []byte("not protobuf \xff")
	recs[3].Value = recs[1].Value

	err := f.tally.HandleRecords(ctx, recs)
	require.Error(t, err)
	var poisoned []*kafka.PoisonError
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var pe *kafka.PoisonError
		require.True(t, errors.As(e, &pe), e)
		poisoned = append(poisoned, pe)
	}
	require.Len(t, poisoned, 2)
	require.Same(t, recs[1], poisoned[0].Record)
	require.Same(t, recs[3], poisoned[1].Record)
	require.Equal(t, counts{completed: 2, runs: 2}, f.counts(t))
	require.Equal(t, int64(4), f.nextOffset(t, 0))
}

// TestEventsThatCountForNoOneArePassed: created and started events are
// skipped by their type alone (even one whose names no store could hold is
// not poison: it is never decoded), and the stored offset passes them.
func TestEventsThatCountForNoOneArePassed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	recs := records(t, 0, 0, 6)
	for i, typ := range map[int]eventsv1.TaskEventType{
		1: eventsv1.TaskEventType_TASK_EVENT_TYPE_CREATED,
		2: eventsv1.TaskEventType_TASK_EVENT_TYPE_STARTED,
		5: eventsv1.TaskEventType_TASK_EVENT_TYPE_CREATED,
	} {
		v, err := proto.Marshal(&eventsv1.TaskEvent{Type: typ, Namespace: "ns", WorkerId: "w\x00", Action: "send", OccurredAt: timestamppb.Now()})
		require.NoError(t, err)
		recs[i].Value = v
	}
	require.NoError(t, f.tally.HandleRecords(t.Context(), recs))
	// Offsets 0 and 4 completed, 3 failed.
	require.Equal(t, counts{completed: 2, failed: 1, runs: 2, fails: 1}, f.counts(t))
	require.Equal(t, int64(6), f.nextOffset(t, 0))
}

// TestOnePollsPartitionsCountInOneTransaction: the batches of several
// partitions (one of them delivered twice, with a prefix counted before) are
// counted in one transaction, each record once, and every partition's
// offset moves with it.
func TestOnePollsPartitionsCountInOneTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.handle(t, 0, 0, 4)
	require.NoError(t, f.tally.HandleTogether(t.Context(),
		records(t, 0, 2, 7), records(t, 1, 0, 3), records(t, 2, 0, 5), records(t, 0, 2, 7)))
	require.Equal(t, counts{completed: 4 + 2 + 3, failed: 3 + 1 + 2, runs: 4 + 2 + 3, fails: 3 + 1 + 2}, f.counts(t))
	for partition, next := range map[int32]int64{0: 7, 1: 3, 2: 5} {
		require.Equal(t, next, f.nextOffset(t, partition))
	}
	var txns int
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT count(DISTINCT xmin::text) FROM tally_offsets WHERE partition IN (1, 2)`).Scan(&txns))
	require.Equal(t, 1, txns, "partitions 1 and 2 were counted in one transaction")
}

// TestEventsWithoutAWorkerCountForNoOne: an outcome no worker had (a task
// that was never started) is passed without a transaction.
func TestEventsWithoutAWorkerCountForNoOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	recs := records(t, 3, 0, 2)
	for _, r := range recs {
		var ev eventsv1.TaskEvent
		require.NoError(t, proto.Unmarshal(r.Value, &ev))
		ev.WorkerId = ""
		v, err := proto.Marshal(&ev)
		require.NoError(t, err)
		r.Value = v
	}
	require.NoError(t, f.tally.HandleRecords(t.Context(), recs))
	require.Equal(t, counts{}, f.counts(t))
	var rows int
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT count(*) FROM tally_offsets`).Scan(&rows))
	require.Zero(t, rows, "nothing was written")
}

// TestConcurrentReplicasCountOnce runs the same records through two tallies
// at once, as two registry replicas overlap during a rebalance, each in
// batches of its own size: the partition's offset row serialises them and
// every record counts once.
func TestConcurrentReplicasCountOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	other := runTally(t, f.pool)
	const n = 300
	recs := records(t, 0, 0, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, tl := range []*tally.Tally{f.tally, other} {
		size := 7 + 6*i
		wg.Go(func() {
			<-start
			for from := 0; from < n && errs[i] == nil; from += size {
				errs[i] = tl.HandleRecords(t.Context(), recs[from:min(from+size, n)])
			}
		})
	}
	close(start)
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, want(n), f.counts(t))
	require.Equal(t, int64(n), f.nextOffset(t, 0))
}
