package kafka_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
)

// keeper is a handler that breaks the BatchHandler contract on purpose: it
// keeps the first record's value without copying it, beside a copy, so a
// test can see whether the record's memory was reused once the handler
// returned.
type keeper struct {
	mu     sync.Mutex
	kept   []byte
	copied []byte
	values []string
}

func (k *keeper) handle(_ context.Context, rs []*kgo.Record) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, r := range rs {
		if k.kept == nil {
			k.kept, k.copied = r.Value, bytes.Clone(r.Value)
		}
		k.values = append(k.values, string(r.Value))
	}
	return nil
}

// await waits until the handler got want.
func (k *keeper) await(t *testing.T, want string) {
	t.Helper()
	require.Eventually(t, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return len(k.values) > 0 && k.values[len(k.values)-1] == want
	}, 20*time.Second, 10*time.Millisecond)
}

// reused reports whether the first value's memory no longer holds it:
// franz-go zeroes a buffer as it goes back to the pool.
func (k *keeper) reused(t *testing.T) bool {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	require.NotEmpty(t, k.copied)
	return !bytes.Equal(k.kept, k.copied)
}

// TestFetchedRecordsAreRecycledAfterTheHandler checks that a Consumer and
// a Tail give each poll's buffers back to franz-go's pool once their handler
// returned (kafka.PooledFetches), while every handler call still sees whole,
// distinct values.
func TestFetchedRecordsAreRecycledAfterTheHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(ctx, prod, 1, "pooled"))
	// Values that compress: snappy, franz-go's default, decompresses into
	// the pooled buffers.
	value := func(n string) string { return n + strings.Repeat("a", 2000) }

	consumed, tailed := &keeper{}, &keeper{}
	c, err := kafka.NewConsumer(broker.Kafka(), "pooled", []string{"pooled"}, consumed.handle, quiet)
	require.NoError(t, err)
	run(t, c.Run)
	startTail(t, broker.Addrs(), "pooled", tailed.handle)

	produce(t, prod, "pooled", value("first"))
	for i := range 20 {
		produce(t, prod, "pooled", value(strings.Repeat("n", i)))
	}
	consumed.await(t, value(strings.Repeat("n", 19)))
	tailed.await(t, value(strings.Repeat("n", 19)))
	// Produced once both have seen the others, the last record comes in a
	// poll of its own, which each reads only after it recycled the polls
	// before.
	last := value("last")
	produce(t, prod, "pooled", last)
	consumed.await(t, last)
	tailed.await(t, last)
	require.True(t, consumed.reused(t), "the consumer recycled the first poll's buffer")
	require.True(t, tailed.reused(t), "the tail recycled the first poll's buffer")

	for _, k := range []*keeper{consumed, tailed} {
		k.mu.Lock()
		require.Equal(t, value("first"), string(k.copied))
		require.Len(t, k.values, 22, "every record once")
		for i := range 20 {
			require.Equal(t, value(strings.Repeat("n", i)), k.values[i+1])
		}
		k.mu.Unlock()
	}
}
