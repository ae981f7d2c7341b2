package outbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.opentelemetry.io/otel/attribute"

	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/telemetry/telemetrytest"
)

// smallTopic is a topic whose broker refuses batches above smallLimit, as
// a topic made outside EnsureTopics with a broker's default may.
const (
	smallTopic = "small"
	smallLimit = 16 << 10
)

func createSmallTopic(t *testing.T, e env) *kadm.Client {
	t.Helper()
	adm := kadm.NewClient(e.producer)
	limit := strconv.Itoa(smallLimit)
	resp, err := adm.CreateTopic(context.Background(), 1, -1, map[string]*string{"max.message.bytes": &limit}, smallTopic)
	require.NoError(t, err)
	require.NoError(t, resp.Err)
	return adm
}

// A record the producer cannot send (larger than its batches) and one the
// broker refuses (larger than the topic takes) are moved to outbox_dead
// with their error; the other records of their rows and the rows behind
// them are published, and the metric counts both. Not parallel: the relay
// counts through the global meter provider, which this test replaces.
func TestRelayDeadLettersRefusedRecords(t *testing.T) {
	metrics := telemetrytest.Global(t)
	e := setup(t)
	ctx := context.Background()
	adm := createSmallTopic(t, e)

	huge := bytes.Repeat([]byte("h"), 2<<20) // past the producer's 1 MiB batches
	// Random, so that compression cannot bring it under the topic's limit.
	big := make([]byte, smallLimit+1024)
	_, _ = rand.Read(big)
	first := values("a", 0, 2)
	first = append(first[:1], outbox.Record{Topic: "events", Key: []byte("one-key"), Value: huge, Headers: map[string]string{"h": "1"}}, first[1])
	second := []outbox.Record{
		{Topic: smallTopic, Key: []byte("k"), Value: []byte("s0"), Headers: map[string]string{}},
		{Topic: smallTopic, Key: []byte("k"), Value: big, Headers: map[string]string{}},
		{Topic: smallTopic, Key: []byte("k"), Value: []byte("s1"), Headers: map[string]string{}},
	}
	write(t, e, ctx, first...)
	write(t, e, ctx, second...)
	write(t, e, ctx, values("b", 0, 5)...)

	events, small := read(t, e, "events"), read(t, e, smallTopic)
	startRelay(t, e).Notify()

	want := append(strs(values("a", 0, 2)), strs(values("b", 0, 5))...)
	require.Eventually(t, func() bool { return len(events.values()) >= len(want) && len(small.values()) >= 2 }, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { _, rows := outboxRecords(t, e); return rows == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, want, events.values(), "the rest of the row and the rows behind it are published in order")
	require.Equal(t, []string{"s0", "s1"}, small.values(), "records that shared a refused batch are published alone")
	// Values are compared by equality from here on: a failure would print
	// them whole.

	dead, err := outbox.ListDead(ctx, e.pool, "svc", 10)
	require.NoError(t, err)
	require.Len(t, dead, 2)
	require.Equal(t, "events", dead[0].Topic)
	require.Equal(t, []byte("one-key"), dead[0].Key)
	require.True(t, bytes.Equal(huge, dead[0].Value))
	require.Equal(t, map[string]string{"h": "1"}, dead[0].Headers)
	require.Contains(t, dead[0].Error, "MESSAGE_TOO_LARGE")
	require.Equal(t, smallTopic, dead[1].Topic)
	require.True(t, bytes.Equal(big, dead[1].Value))
	require.Contains(t, dead[1].Error, "MESSAGE_TOO_LARGE")
	require.Greater(t, dead[1].OutboxID, dead[0].OutboxID)
	require.False(t, dead[0].DeadAt.Before(dead[0].WrittenAt))

	require.Eventually(t, func() bool {
		n, _ := metrics.Value("flo.outbox.dead_lettered", attribute.String("schema", "svc"))
		return n == 2
	}, 10*time.Second, 10*time.Millisecond)

	// Once the topic takes the record, a requeued one is published.
	limit := strconv.Itoa(1 << 20)
	resps, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &limit}}, smallTopic)
	require.NoError(t, err)
	require.NoError(t, resps[0].Err)
	moved, err := outbox.Requeue(ctx, e.pool, "svc", []int64{dead[1].ID, dead[1].ID + 1000})
	require.NoError(t, err)
	require.EqualValues(t, 1, moved)
	require.Eventually(t, func() bool { return len(small.values()) == 3 }, 20*time.Second, 10*time.Millisecond)
	require.True(t, small.values()[2] == string(big))
	left, err := outbox.ListDead(ctx, e.pool, "svc", 10)
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, dead[0].ID, left[0].ID)
}
