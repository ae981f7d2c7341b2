package kafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
)

var quiet = slog.New(slog.DiscardHandler)

func newProducer(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kafka.NewClient(config.Kafka{Brokers: brokers})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func produce(t *testing.T, cl *kgo.Client, topic string, values ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs := make([]*kgo.Record, len(values))
	for i, v := range values {
		// One key: every record lands on one partition, in order.
		rs[i] = &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(v)}
	}
	require.NoError(t, cl.ProduceSync(ctx, rs...).FirstErr())
}

// run starts r in the background and returns a func that stops it and waits.
func run(t *testing.T, r func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// lost is a transient error: the connection was reset.
var lost = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}

// collector records handled values and fails the first failures calls with a
// transient error.
type collector struct {
	mu       sync.Mutex
	failures int
	calls    int
	values   []string
}

// await waits until the handler got v.
func (c *collector) await(t *testing.T, v string) {
	t.Helper()
	require.Eventually(t, func() bool { return slices.Contains(c.got(), v) }, 20*time.Second, 10*time.Millisecond)
}

func (c *collector) handle(_ context.Context, rs []*kgo.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.failures > 0 {
		c.failures--
		return fmt.Errorf("not yet: %w", lost)
	}
	for _, r := range rs {
		c.values = append(c.values, string(r.Value))
	}
	return nil
}

func (c *collector) got() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.values)
}

func seq(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

func TestConsumerRetriesAndCommitsOnlyAfterSuccess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 3, "orders"))
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 3, "orders"), "existing topics are fine")
	want := seq("v", 20)
	produce(t, prod, "orders", want...)

	col := &collector{failures: 3}
	c, err := kafka.NewConsumer(broker.Kafka(), "g1", []string{"orders"}, col.handle, quiet)
	require.NoError(t, err)
	stop := run(t, c.Run)
	require.Eventually(t, func() bool { return len(col.got()) >= len(want) }, 20*time.Second, 10*time.Millisecond)
	stop()
	require.Equal(t, want, col.got(), "every record once, in order, after the failed tries")
	require.GreaterOrEqual(t, col.calls, 4)

	adm := kadm.NewClient(prod)
	committed, err := adm.FetchOffsets(ctx, "g1")
	require.NoError(t, err)
	ends, err := adm.ListEndOffsets(ctx, "orders")
	require.NoError(t, err)
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset == 0 {
			return
		}
		got, ok := committed.Lookup("orders", o.Partition)
		require.True(t, ok, "partition %d committed", o.Partition)
		require.Equal(t, o.Offset, got.At)
	})

	// A new member of the group starts after the committed records.
	produce(t, prod, "orders", "new")
	col2 := &collector{}
	c2, err := kafka.NewConsumer(broker.Kafka(), "g1", []string{"orders"}, col2.handle, quiet)
	require.NoError(t, err)
	run(t, c2.Run)
	require.Eventually(t, func() bool { return len(col2.got()) >= 1 }, 20*time.Second, 10*time.Millisecond)
	require.Never(t, func() bool { return len(col2.got()) > 1 }, 300*time.Millisecond, 20*time.Millisecond)
	require.Equal(t, []string{"new"}, col2.got())
}

func TestConsumerRedeliversUnhandled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 1, "jobs"))
	want := seq("j", 5)
	produce(t, prod, "jobs", want...)

	// The first member never succeeds; it stops while retrying.
	failing := &collector{failures: 1 << 30}
	c1, err := kafka.NewConsumer(broker.Kafka(), "g2", []string{"jobs"}, failing.handle, quiet)
	require.NoError(t, err)
	stop := run(t, c1.Run)
	require.Eventually(t, func() bool {
		failing.mu.Lock()
		defer failing.mu.Unlock()
		return failing.calls >= 2
	}, 20*time.Second, 10*time.Millisecond)
	stop()

	// Nothing was committed, so the next member gets everything.
	col := &collector{}
	c2, err := kafka.NewConsumer(broker.Kafka(), "g2", []string{"jobs"}, col.handle, quiet)
	require.NoError(t, err)
	run(t, c2.Run)
	require.Eventually(t, func() bool { return len(col.got()) >= len(want) }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, want, col.got())
}

func TestConsumerSurvivesBrokerRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 2, "events"))
	col := &collector{}
	c, err := kafka.NewConsumer(broker.Kafka(), "g3", []string{"events"}, col.handle, quiet)
	require.NoError(t, err)
	run(t, c.Run)

	produce(t, prod, "events", "a", "b")
	require.Eventually(t, func() bool { return len(col.got()) == 2 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, broker.Restart())
	produce(t, prod, "events", "c", "d")
	require.Eventually(t, func() bool { return len(col.got()) >= 4 }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"a", "b", "c", "d"}, col.got())
}

func TestTail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())

	col := &collector{failures: 1}
	tail, err := kafka.NewTail(broker.Kafka(), []string{"done"}, col.handle, quiet)
	require.NoError(t, err)
	run(t, tail.Run)
	select {
	case <-tail.Ready():
		t.Fatal("ready before its topic exists")
	case <-time.After(200 * time.Millisecond):
	}

	require.NoError(t, kafka.EnsureTopics(ctx, prod, 4, "done"))
	produce(t, prod, "done", "before")
	// The tail may or may not see "before", depending on when it lists
	// offsets; it must see everything produced after Ready.
	select {
	case <-tail.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("tail not ready")
	}
	produce(t, prod, "done", "after1", "after2")
	col.await(t, "after2")
	got := col.got()
	got = slices.DeleteFunc(got, func(v string) bool { return v == "before" })
	require.Equal(t, []string{"after1", "after2"}, got)
}

// startTail runs a tail over topic and waits until it is ready.
func startTail(t *testing.T, brokers []string, topic string, h kafka.BatchHandler) {
	t.Helper()
	tail, err := kafka.NewTail(config.Kafka{Brokers: brokers}, []string{topic}, h, quiet)
	require.NoError(t, err)
	run(t, tail.Run)
	select {
	case <-tail.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("tail not ready")
	}
}

func TestTailStartsAtEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 2, "feed"))
	produce(t, prod, "feed", "old1", "old2")

	col := &collector{}
	startTail(t, broker.Addrs(), "feed", col.handle)
	produce(t, prod, "feed", "new")
	require.Eventually(t, func() bool { return len(col.got()) > 0 }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"new"}, col.got())
}

func TestTraceHeadersRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled,
	})
	spanCtx := trace.ContextWithSpanContext(ctx, sc)

	h := kafka.TraceHeaders(spanCtx)
	require.Equal(t, "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01", h["traceparent"])
	require.Equal(t, sc.TraceID(), trace.SpanContextFromContext(kafka.ContextFromHeaders(ctx, h)).TraceID())
	require.Empty(t, kafka.TraceHeaders(ctx), "no span, no headers")

	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 1, "traced"))

	var (
		mu  sync.Mutex
		got []trace.SpanContext
	)
	tail, err := kafka.NewTail(broker.Kafka(), []string{"traced"}, func(ctx context.Context, rs []*kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range rs {
			got = append(got, trace.SpanContextFromContext(kafka.ExtractTrace(ctx, r)))
		}
		return nil
	}, quiet)
	require.NoError(t, err)
	run(t, tail.Run)
	<-tail.Ready()

	r := &kgo.Record{Topic: "traced", Value: []byte("x"), Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("stale")}, {Key: "other", Value: []byte("kept")}}}
	kafka.InjectTrace(spanCtx, r)
	require.Len(t, r.Headers, 2, "traceparent replaced, not duplicated")
	require.NoError(t, prod.ProduceSync(ctx, r).FirstErr())
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 1
	}, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, sc.TraceID(), got[0].TraceID())
	require.Equal(t, sc.SpanID(), got[0].SpanID())
	require.True(t, got[0].IsRemote())
}

func TestConsumersShareAndHandOverPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 6, "work"))

	seen := &collector{}
	c1, err := kafka.NewConsumer(broker.Kafka(), "g4", []string{"work"}, seen.handle, quiet)
	require.NoError(t, err)
	stop1 := run(t, c1.Run)

	rs := make([]*kgo.Record, 0, 600)
	for i := range 600 {
		rs = append(rs, &kgo.Record{Topic: "work", Key: fmt.Appendf(nil, "k%d", i%37), Value: fmt.Appendf(nil, "w%03d", i)})
	}
	require.NoError(t, prod.ProduceSync(ctx, rs[:300]...).FirstErr())

	// A second member joins while records flow, then the first leaves.
	c2, err := kafka.NewConsumer(broker.Kafka(), "g4", []string{"work"}, seen.handle, quiet)
	require.NoError(t, err)
	stop2 := run(t, c2.Run)
	require.NoError(t, prod.ProduceSync(ctx, rs[300:450]...).FirstErr())
	require.Eventually(t, func() bool { return len(seen.got()) >= 450 }, 20*time.Second, 10*time.Millisecond)
	stop1()
	require.NoError(t, prod.ProduceSync(ctx, rs[450:]...).FirstErr())
	require.Eventually(t, func() bool { return len(seen.got()) >= 600 }, 20*time.Second, 10*time.Millisecond)
	stop2()

	// Every record was handled; a record handled twice is allowed
	// (at-least-once), a missing one is not.
	got := map[string]bool{}
	for _, v := range seen.got() {
		got[v] = true
	}
	for _, r := range rs {
		require.True(t, got[string(r.Value)], "record %s handled", r.Value)
	}

	// All progress is committed: a new member has nothing to do.
	adm := kadm.NewClient(prod)
	committed, err := adm.FetchOffsets(ctx, "g4")
	require.NoError(t, err)
	ends, err := adm.ListEndOffsets(ctx, "work")
	require.NoError(t, err)
	ends.Each(func(o kadm.ListedOffset) {
		got, _ := committed.Lookup("work", o.Partition)
		require.Equal(t, o.Offset, got.At, "partition %d", o.Partition)
	})
}

func TestNoTopics(t *testing.T) {
	t.Parallel()
	_, err := kafka.NewConsumer(config.Kafka{Brokers: []string{"127.0.0.1:1"}}, "g", nil, (&collector{}).handle, nil)
	require.Error(t, err)
	_, err = kafka.NewTail(config.Kafka{Brokers: []string{"127.0.0.1:1"}}, nil, (&collector{}).handle, nil)
	require.Error(t, err)
	_, err = kafka.NewClient(config.Kafka{})
	require.Error(t, err)
}

// PartitionOf names the partition a producer with the default partitioner
// sends a keyed record to, so a reader can find a task by its id.
func TestPartitionOfAgreesWithProducers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 7, "keyed"))
	rs := make([]*kgo.Record, 200)
	for i := range rs {
		rs[i] = &kgo.Record{Topic: "keyed", Key: fmt.Appendf(nil, "%s%d", strings.Repeat("t", i%5), i)}
	}
	require.NoError(t, prod.ProduceSync(ctx, rs...).FirstErr())
	seen := map[int32]bool{}
	for _, r := range rs {
		require.Equal(t, r.Partition, kafka.PartitionOf(string(r.Key), 7), "key %s", r.Key)
		seen[r.Partition] = true
	}
	require.Len(t, seen, 7, "200 keys spread over every partition")
}

// PartitionOf hashes as franz-go's default partitioner does, for keys of
// every length (each tail of the four-byte loop) and any byte.
func TestPartitionOfHashesAsFranzGo(t *testing.T) {
	t.Parallel()
	keyed := kgo.StickyKeyPartitioner(nil).ForTopic("")
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 20_000 {
		key := make([]byte, rnd.IntN(70))
		for i := range key {
			key[i] = byte(rnd.Uint32())
		}
		n := 1 + rnd.Int32N(64)
		require.Equal(t, int32(keyed.Partition(&kgo.Record{Key: key}, int(n))), kafka.PartitionOf(string(key), n), "key %x, %d partitions", key, n)
	}
}

// A tail reads committed records only: what a transaction aborted never
// reaches it.
func TestTailSkipsAbortedTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 1, "txns"))
	col := &collector{}
	startTail(t, broker.Addrs(), "txns", col.handle)

	txn, err := kafka.NewClient(broker.Kafka(), kgo.TransactionalID("tail-test"))
	require.NoError(t, err)
	t.Cleanup(txn.Close)
	for _, c := range []struct {
		value  string
		commit kgo.TransactionEndTry
	}{{"aborted", kgo.TryAbort}, {"committed", kgo.TryCommit}} {
		require.NoError(t, txn.BeginTransaction())
		require.NoError(t, txn.ProduceSync(ctx, &kgo.Record{Topic: "txns", Value: []byte(c.value)}).FirstErr())
		require.NoError(t, txn.EndTransaction(ctx, c.commit))
	}
	produce(t, prod, "txns", "plain")
	col.await(t, "plain")
	require.Equal(t, []string{"committed", "plain"}, col.got())
}

// Records that come one at a time are committed together, at most every
// half second, and the last of them soon after the records stop.
func TestConsumerCommitsSpacedOut(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(t.Context(), prod, 1, "trickle"))
	col := &collector{}
	// Only the consumer commits offsets here.
	broker.CountRequests()
	c, err := kafka.NewConsumer(broker.Kafka(), "spaced", []string{"trickle"}, col.handle, quiet)
	require.NoError(t, err)
	run(t, c.Run)

	const n = 40
	start := time.Now()
	for i := range n {
		produce(t, prod, "trickle", strconv.Itoa(i))
		require.Eventually(t, func() bool { return len(col.got()) == i+1 }, waitFor, time.Millisecond)
	}
	requireCommittedToEnd(t, prod, "spaced", "trickle")
	elapsed := time.Since(start)
	// One commit per half second of the run, and the last.
	bound := int64(elapsed/(500*time.Millisecond)) + 2
	require.LessOrEqual(t, broker.Requests()["OffsetCommit"], bound, "%d records handled one by one over %v", n, elapsed)
}
