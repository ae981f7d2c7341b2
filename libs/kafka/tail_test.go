package kafka_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/localbroker"
)

// startDemandTail runs a tail over topic that reads on demand, stopping
// idle after its last follower, and waits until it is ready.
func startDemandTail(t *testing.T, broker *localbroker.Broker, topic string, idle time.Duration, h kafka.BatchHandler) *kafka.Tail {
	t.Helper()
	tail, err := kafka.NewTail(broker.Kafka(), []string{topic}, h, quiet)
	require.NoError(t, err)
	tail.ReadOnDemand(idle)
	run(t, tail.Run)
	select {
	case <-tail.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("tail not ready")
	}
	return tail
}

func follow(t *testing.T, tail *kafka.Tail) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stop, err := tail.Follow(ctx)
	require.NoError(t, err)
	return stop
}

func TestTailReadsOnlyWhileFollowed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 2, "waits"))

	col := &collector{}
	tail := startDemandTail(t, broker, "waits", 50*time.Millisecond, col.handle)
	require.False(t, tail.Reading(), "nobody follows yet")
	produce(t, prod, "waits", "unfollowed")

	stop := follow(t, tail)
	require.True(t, tail.Reading())
	produce(t, prod, "waits", "a")
	col.await(t, "a")

	// A second follower keeps it reading after the first stops.
	stop2 := follow(t, tail)
	stop()
	stop() // stop is idempotent
	produce(t, prod, "waits", "b")
	col.await(t, "b")
	require.True(t, tail.Reading())

	stop2()
	require.Eventually(t, func() bool { return !tail.Reading() }, 20*time.Second, 10*time.Millisecond, "idle after the last follower")
	produce(t, prod, "waits", "between")

	stop = follow(t, tail)
	defer stop()
	produce(t, prod, "waits", "c")
	col.await(t, "c")
	// What was committed while nobody followed was never read: each
	// Follow starts at the committed end.
	require.Equal(t, []string{"a", "b", "c"}, col.got())
}

// A record of a transaction still open when Follow lists the offsets is
// below the high watermark; it must reach the handler once it commits.
func TestTailFollowedReadsATransactionOpenAtTheStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 1, "txn"))

	col := &collector{}
	tail := startDemandTail(t, broker, "txn", time.Minute, col.handle)

	txn, err := kafka.NewClient(broker.Kafka(), kgo.TransactionalID("tail-test"))
	require.NoError(t, err)
	t.Cleanup(txn.Close)
	require.NoError(t, txn.BeginTransaction())
	require.NoError(t, txn.ProduceSync(ctx, &kgo.Record{Topic: "txn", Value: []byte("open")}).FirstErr())

	stop := follow(t, tail)
	defer stop()
	require.NoError(t, txn.EndTransaction(ctx, kgo.TryCommit))
	produce(t, prod, "txn", "after")
	col.await(t, "after")
	require.Equal(t, []string{"open", "after"}, col.got())
}

func TestTailFollowWaitsForReady(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	tail, err := kafka.NewTail(broker.Kafka(), []string{"never-made"}, (&collector{}).handle, quiet)
	require.NoError(t, err)
	tail.ReadOnDemand(time.Second)
	run(t, tail.Run)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = tail.Follow(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// Partitions added to a tail's topic while it reads (a repartition of the
// task topics) are read from their start once the tail looks for them,
// which Run does every partitionsRefresh.
func TestTailReadsPartitionsAddedWhileItReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 1, "grows"))
	col := &collector{}
	tail := startDemandTail(t, broker, "grows", time.Minute, col.handle)
	stop := follow(t, tail)
	defer stop()

	resp, err := kadm.NewClient(prod).UpdatePartitions(ctx, 2, "grows")
	require.NoError(t, err)
	require.NoError(t, resp.Error())
	manual, err := kgo.NewClient(kgo.SeedBrokers(broker.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer manual.Close()
	require.NoError(t, manual.ProduceSync(ctx, &kgo.Record{Topic: "grows", Partition: 1, Value: []byte("new")}).FirstErr())

	require.NoError(t, tail.AddNewPartitions(ctx))
	// Sooner than Run's own look (partitionsRefresh) would find it.
	require.Eventually(t, func() bool { return slices.Contains(col.got(), "new") }, 5*time.Second, 10*time.Millisecond)
	produce(t, prod, "grows", "old")
	col.await(t, "old")
}
