package owner

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// A partition commits only under the producer id it took itself. franz-go
// initializes a transactional producer's id again on its own after a
// transaction ended without a clear answer (here its context ran out; in a
// replica paused past its session, a deadline that passed during the
// pause), and an initialization takes the transactional id from whoever
// holds it: here the next owner. The partition's next batch must not
// commit, although its producer now holds the id.
func TestAPartitionDoesNotCommitUnderAnIDItsProducerTookBackOnItsOwn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	broker := harness.NewBroker(t)
	admin, err := kafka.NewClient(broker.Kafka())
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	require.NoError(t, kafka.EnsureTopics(ctx, admin, 1, kafka.TaskEventsTopic))

	r := &Replica{cfg: Config{Kafka: broker.Kafka()}, log: slog.New(slog.DiscardHandler)}
	p := newPartition(r, 0, func() (*producer, error) { return r.newProducer(0) })
	require.NoError(t, p.makeTxn())
	t.Cleanup(p.dropTxn)
	require.NoError(t, p.takeID(ctx))

	eng := engine.New(0)
	now := time.Now()
	invoke := func() []engine.Change {
		return eng.Invoke(nil, engine.Invocation{TaskID: uuid.New(), Namespace: "ns", Action: "a", Payload: []byte(`{}`), InvokedAt: now},
			&store.Settings{Timeout: time.Minute, MaxAttempts: 1}, "", now)
	}
	// Batches under the id the partition took commit, the producer's epoch
	// moving on with each (KIP-890) without another initialization.
	var first []engine.Change
	for range 3 {
		batch := invoke()
		_, err = p.record(ctx, batch, nil)
		require.NoError(t, err)
		first = append(first, batch...)
	}
	require.False(t, p.txn.tookOnItsOwn())

	// A transaction whose end gets no answer.
	require.NoError(t, p.txn.BeginTransaction())
	require.NoError(t, p.txn.ProduceSync(ctx, &kgo.Record{Topic: kafka.TaskEventsTopic, Partition: 0, Value: []byte("unanswered")}).FirstErr())
	gone, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, p.txn.EndTransaction(gone, kgo.TryCommit))

	// The next owner takes the id; the old producer's abort takes it back.
	next, err := kgo.NewClient(kgo.SeedBrokers(broker.Addrs()...), kgo.TransactionalID(kafka.DispatcherGroup+"-p"+strconv.Itoa(0)))
	require.NoError(t, err)
	t.Cleanup(next.Close)
	_, _, err = next.ProducerID(ctx)
	require.NoError(t, err)
	require.NoError(t, p.txn.EndTransaction(ctx, kgo.TryAbort))
	require.True(t, p.txn.tookOnItsOwn(), "the producer initialized its id again")

	_, err = p.record(ctx, invoke(), nil)
	require.ErrorIs(t, err, errFenced)

	// A read_committed reader sees the first batches' records, then a
	// record written after the refused batch, and nothing between.
	plain, err := kgo.NewClient(kgo.SeedBrokers(broker.Addrs()...), kgo.DefaultProduceTopic(kafka.TaskEventsTopic))
	require.NoError(t, err)
	t.Cleanup(plain.Close)
	require.NoError(t, plain.ProduceSync(ctx, &kgo.Record{Partition: 0, Key: []byte("after")}).FirstErr())
	reader, err := kgo.NewClient(kgo.SeedBrokers(broker.Addrs()...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{kafka.TaskEventsTopic: {0: kgo.NewOffset().AtStart()}}))
	require.NoError(t, err)
	t.Cleanup(reader.Close)
	var keys []string
	for !slices.Contains(keys, "after") {
		fetches := reader.PollFetches(ctx)
		require.NoError(t, fetches.Err())
		for _, rec := range fetches.Records() {
			keys = append(keys, string(rec.Key))
		}
	}
	want := []string{}
	for _, c := range first {
		want = append(want, c.Task.ID.String())
	}
	require.Equal(t, append(want, "after"), keys)
}
