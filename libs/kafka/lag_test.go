package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/telemetry/telemetrytest"
)

// Not parallel: the consumer reports through the global meter provider,
// which this test replaces while it runs.
func TestConsumerReportsLag(t *testing.T) {
	metrics := telemetrytest.Global(t)
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 1, "lagging"))
	// One produce per record: each is its own batch, and the consumer below
	// fetches one batch at a time.
	for _, v := range seq("l", 10) {
		produce(t, prod, "lagging", v)
	}

	handled := make(chan int, 16)
	release := make(chan struct{})
	calls := 0
	c, err := kafka.NewConsumer(broker.Kafka(), "lag-group", []string{"lagging"}, func(ctx context.Context, rs []*kgo.Record) error {
		calls++
		if calls == 2 {
			<-release
		}
		handled <- len(rs)
		return nil
	}, quiet, kgo.FetchMaxBytes(1), kgo.FetchMaxPartitionBytes(1))
	require.NoError(t, err)
	run(t, c.Run)

	first := <-handled
	require.Less(t, first, 10, "the first fetch took part of the topic")
	require.Eventually(t, func() bool { return c.Lag()["lagging"] == int64(10-first) }, 10*time.Second, 10*time.Millisecond)
	attrs := []attribute.KeyValue{attribute.String("topic", "lagging"), attribute.String("group", "lag-group")}
	reported, ok := metrics.Value("flo.consumer.lag", attrs...)
	require.True(t, ok)
	require.EqualValues(t, 10-first, reported)

	close(release)
	require.Eventually(t, func() bool { return c.Lag()["lagging"] == 0 }, 20*time.Second, 10*time.Millisecond)
	reported, ok = metrics.Value("flo.consumer.lag", attrs...)
	require.True(t, ok)
	require.Zero(t, reported)
}

// Records written in transactions are followed by a marker that takes an
// offset: the consumer never hands a marker to its handler, yet its lag
// reaches zero at the end of the partition.
func TestConsumerLagCountsTransactionMarkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 1, "txn-lag"))
	txn, err := kafka.NewClient(broker.Kafka(), kgo.TransactionalID("lag-test"))
	require.NoError(t, err)
	t.Cleanup(txn.Close)
	for _, v := range seq("t", 3) {
		require.NoError(t, txn.BeginTransaction())
		require.NoError(t, txn.ProduceSync(ctx, &kgo.Record{Topic: "txn-lag", Value: []byte(v)}).FirstErr())
		require.NoError(t, txn.EndTransaction(ctx, kgo.TryCommit))
	}

	col := &collector{}
	c, err := kafka.NewConsumer(broker.Kafka(), "txn-lag-group", []string{"txn-lag"}, col.handle, quiet)
	require.NoError(t, err)
	run(t, c.Run)
	require.Eventually(t, func() bool { return len(col.got()) == 3 }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, seq("t", 3), col.got(), "markers are not records")
	require.Eventually(t, func() bool { return c.Lag()["txn-lag"] == 0 }, 20*time.Second, 10*time.Millisecond)
}
