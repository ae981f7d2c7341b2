package kafka_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/localbroker"
)

// A consumer that takes over the task outcomes joins its group only once no
// dispatcher of an earlier version is in theirs, hands its handler first
// what its group left of the task events (the outcomes those dispatchers
// wrote nowhere else), then the outcomes; started again, it reads only the
// outcomes.
func TestTakeOverWaitsForEarlierDispatchersThenHandlesWhatIsLeft(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	broker, prod, adm := newTaskTopics(t)
	const group = "takes-over"
	// The group's earlier version read the task events and handled e0.
	produce(t, prod, kafka.TaskEventsTopic, "e0", "e1", "e2")
	commitEventsOffset(t, adm, group, 1)

	// A dispatcher of an earlier version: franz-go's default client id.
	earlier, err := kafka.NewClient(broker.Kafka(), kgo.ConsumerGroup(kafka.DispatcherGroup), kgo.ConsumeTopics(kafka.CommandsTopic))
	require.NoError(t, err)
	// A dispatcher of this version in the group keeps no one waiting.
	current, err := kafka.NewClient(broker.Kafka(), kgo.ConsumerGroup(kafka.DispatcherGroup), kgo.ConsumeTopics(kafka.CommandsTopic),
		kgo.ClientID(kafka.DispatcherClientID))
	require.NoError(t, err)
	t.Cleanup(current.Close)
	require.Eventually(t, func() bool {
		members, err := kafka.DispatcherMembers(ctx, adm)
		return err == nil && len(members) == 2
	}, waitFor, 10*time.Millisecond)

	col := &collector{}
	c, err := kafka.NewConsumer(broker.Kafka(), group, []string{kafka.TaskOutcomesTopic}, col.handle, quiet)
	require.NoError(t, err)
	c.TakeOverTaskOutcomes()
	require.Error(t, c.HandedOver(ctx))
	stop := run(t, c.Run)
	produce(t, prod, kafka.TaskOutcomesTopic, "o0")
	require.Eventually(t, func() bool {
		err := c.HandedOver(ctx)
		return err != nil && strings.Contains(err.Error(), "waiting for the dispatchers of an earlier version (1: ")
	}, waitFor, 10*time.Millisecond)
	// It saw the earlier dispatcher: it handled nothing and left its group
	// to the group's earlier version.
	require.Empty(t, col.got())
	groups, err := adm.DescribeGroups(ctx, group)
	require.NoError(t, err)
	require.Empty(t, groups[group].Members)

	earlier.Close()
	col.await(t, "o0")
	require.Equal(t, []string{"e1", "e2", "o0"}, col.got())
	require.NoError(t, c.HandedOver(ctx))
	stop()

	// Started again, its group has offsets of the outcomes: the task events
	// are not read again.
	produce(t, prod, kafka.TaskEventsTopic, "e3")
	produce(t, prod, kafka.TaskOutcomesTopic, "o1")
	again := &collector{}
	c, err = kafka.NewConsumer(broker.Kafka(), group, []string{kafka.TaskOutcomesTopic}, again.handle, quiet)
	require.NoError(t, err)
	c.TakeOverTaskOutcomes()
	run(t, c.Run)
	again.await(t, "o1")
	require.Equal(t, []string{"o1"}, again.got())
}

// A task events range that ends in a transaction's marker is read to its
// end, and the records of an aborted transaction are not handed over.
func TestTakeOverReadsCommittedTransactionsToTheirMarker(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	broker, prod, adm := newTaskTopics(t)
	const group = "takes-over-transactions"
	produce(t, prod, kafka.TaskEventsTopic, "e0")
	commitEventsOffset(t, adm, group, 0)
	txn, err := kafka.NewClient(broker.Kafka(), kgo.TransactionalID("takeover-test"))
	require.NoError(t, err)
	defer txn.Close()
	for _, end := range []struct {
		value  string
		commit kgo.TransactionEndTry
	}{{"aborted", kgo.TryAbort}, {"committed", kgo.TryCommit}} {
		require.NoError(t, txn.BeginTransaction())
		require.NoError(t, txn.ProduceSync(ctx, &kgo.Record{Topic: kafka.TaskEventsTopic, Key: []byte("k"), Value: []byte(end.value)}).FirstErr())
		require.NoError(t, txn.EndTransaction(ctx, end.commit))
	}

	col := &collector{}
	c, err := kafka.NewConsumer(broker.Kafka(), group, []string{kafka.TaskOutcomesTopic}, col.handle, quiet)
	require.NoError(t, err)
	c.TakeOverTaskOutcomes()
	run(t, c.Run)
	require.Eventually(t, func() bool { return c.HandedOver(ctx) == nil }, waitFor, 10*time.Millisecond)
	require.Equal(t, []string{"e0", "committed"}, col.got())
}

// A group that never read anything hands over nothing: its outcomes come at
// once.
func TestTakeOverOfANewGroup(t *testing.T) {
	t.Parallel()
	broker, prod, _ := newTaskTopics(t)
	produce(t, prod, kafka.TaskEventsTopic, "e0")
	produce(t, prod, kafka.TaskOutcomesTopic, "o0")
	col := &collector{}
	c, err := kafka.NewConsumer(broker.Kafka(), "new-group", []string{kafka.TaskOutcomesTopic}, col.handle, quiet)
	require.NoError(t, err)
	c.TakeOverTaskOutcomes()
	run(t, c.Run)
	col.await(t, "o0")
	require.Equal(t, []string{"o0"}, col.got())
	require.NoError(t, c.HandedOver(t.Context()))
}

// commitEventsOffset commits offset at of the task events' partition 0 for
// group, as the group's earlier version did.
func commitEventsOffset(t *testing.T, adm *kadm.Client, group string, at int64) {
	t.Helper()
	var handled kadm.Offsets
	handled.Add(kadm.Offset{Topic: kafka.TaskEventsTopic, Partition: 0, At: at, LeaderEpoch: -1})
	resp, err := adm.CommitOffsets(t.Context(), group, handled)
	require.NoError(t, err)
	require.NoError(t, resp.Error())
}

// newTaskTopics starts a broker with the task topics of one partition and
// returns it with a producer and an admin client.
func newTaskTopics(t *testing.T) (*localbroker.Broker, *kgo.Client, *kadm.Client) {
	t.Helper()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(t.Context(), prod, 1, kafka.CommandsTopic, kafka.TaskEventsTopic, kafka.TaskOutcomesTopic))
	return broker, prod, kadm.NewClient(prod)
}
