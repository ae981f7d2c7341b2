package localbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/localbroker"
)

func TestRestartKeepsRecordsAndOffsets(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := localbroker.Start(0, t.TempDir(), 3)
	require.NoError(t, err)
	t.Cleanup(b.Close)
	addrs := b.Addrs()

	producer, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("t"))
	require.NoError(t, err)
	defer producer.Close()
	for _, v := range []string{"a", "b", "c"} {
		require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte(v)}).FirstErr())
	}

	// A group member reads two records and commits them.
	consume := func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.DisableAutoCommit(), kgo.FetchMaxWait(200*time.Millisecond))
		require.NoError(t, err)
		return cl
	}
	first := consume()
	var got []*kgo.Record
	for len(got) < 3 {
		fs := first.PollFetches(ctx)
		require.NoError(t, fs.Err0())
		got = append(got, fs.Records()...)
	}
	require.NoError(t, first.CommitRecords(ctx, got[1]))
	first.Close()

	require.NoError(t, b.Restart())
	require.Equal(t, addrs, b.Addrs(), "same port after restart")

	second := consume()
	defer second.Close()
	fs := second.PollFetches(ctx)
	require.NoError(t, fs.Err0())
	require.Equal(t, []string{"c"}, values(fs.Records()), "resumes after the committed offset")

	// Close and Restart: the broker comes back after being down.
	b.Close()
	require.NoError(t, b.Restart())
	require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte("d")}).FirstErr())
	fs = second.PollFetches(ctx)
	require.NoError(t, fs.Err0())
	require.Equal(t, []string{"d"}, values(fs.Records()))
}

func TestDefaultPartitions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := localbroker.Start(0, "", 5)
	require.NoError(t, err)
	t.Cleanup(b.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.AllowAutoTopicCreation())
	require.NoError(t, err)
	defer cl.Close()
	r := cl.ProduceSync(ctx, &kgo.Record{Topic: "auto", Value: []byte("x")})
	require.NoError(t, r.FirstErr())
	parts := map[int32]bool{}
	for i := range 50 {
		rec, err := cl.ProduceSync(ctx, &kgo.Record{Topic: "auto", Key: []byte{byte(i)}, Value: []byte("x")}).First()
		require.NoError(t, err)
		parts[rec.Partition] = true
	}
	for p := range parts {
		require.Less(t, p, int32(5))
	}
}

func values(rs []*kgo.Record) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r.Value)
	}
	return out
}

// The broker counts the requests it handles once asked, and goes on
// counting after a restart; the requests are answered as usual.
func TestCountRequests(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := localbroker.Start(0, t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(b.Close)
	require.Empty(t, b.Requests(), "nothing counted before CountRequests")
	b.CountRequests()
	b.CountRequests()

	producer, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("t"))
	require.NoError(t, err)
	defer producer.Close()
	for _, v := range []string{"a", "b"} {
		require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr())
	}
	got := b.Requests()
	require.GreaterOrEqual(t, got["Produce"], int64(2), "a produce request for each synchronous produce")
	require.Positive(t, got["Metadata"])

	require.NoError(t, b.Restart())
	require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Value: []byte("c")}).FirstErr())
	require.Greater(t, b.Requests()["Produce"], got["Produce"], "counted after the restart too")
}
