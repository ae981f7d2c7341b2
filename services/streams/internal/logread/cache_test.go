package logread_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/services/streams/internal/logread"
)

func recs(first, last int64) []*kgo.Record {
	var out []*kgo.Record
	for o := first; o <= last; o++ {
		out = append(out, &kgo.Record{Offset: o, Value: make([]byte, 100)})
	}
	return out
}

func offsets(rs []*kgo.Record) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.Offset
	}
	return out
}

func TestCacheServesContiguousRuns(t *testing.T) {
	t.Parallel()
	c := logread.NewCache(1 << 20)
	c.Add("t", 0, 10, recs(10, 14))
	c.Add("t", 0, 15, recs(15, 19))
	c.Add("t", 0, 30, recs(30, 31))
	c.Add("t", 1, 0, recs(0, 3))

	got, next := c.Get(nil, "t", 0, 12, 100)
	require.Equal(t, []int64{12, 13, 14, 15, 16, 17, 18, 19}, offsets(got), "adjacent chunks join; a gap stops")
	require.Equal(t, int64(20), next)
	got, next = c.Get(nil, "t", 0, 12, 3)
	require.Equal(t, []int64{12, 13, 14}, offsets(got))
	require.Equal(t, int64(15), next)
	got, next = c.Get(nil, "t", 0, 20, 5)
	require.Empty(t, got)
	require.Equal(t, int64(20), next)
	got, _ = c.Get(nil, "t", 1, 0, 10)
	require.Equal(t, []int64{0, 1, 2, 3}, offsets(got), "partitions apart")

	// A larger fetch replaces the chunks it covers; a covered one is ignored.
	c.Add("t", 0, 10, recs(10, 25))
	c.Add("t", 0, 12, recs(12, 13))
	got, next = c.Get(nil, "t", 0, 11, 100)
	require.Equal(t, int64(26), next)
	require.Len(t, got, 15)

	c.Forget("t")
	got, _ = c.Get(nil, "t", 0, 10, 10)
	require.Empty(t, got)
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	// Each record counts a little over 200 bytes; 10 records a chunk.
	c := logread.NewCache(10_000)
	c.Add("t", 0, 0, recs(0, 9))
	c.Add("t", 0, 10, recs(10, 19))
	c.Get(nil, "t", 0, 0, 1) // the first chunk is used again
	for p := int32(1); p <= 3; p++ {
		c.Add("t", p, 0, recs(0, 9))
	}
	got, _ := c.Get(nil, "t", 0, 0, 10)
	require.Len(t, got, 10, "recently used stays")
	got, _ = c.Get(nil, "t", 0, 10, 10)
	require.Empty(t, got, "least recently used goes")

	off := logread.NewCache(0)
	off.Add("t", 0, 0, recs(0, 9))
	got, next := off.Get(nil, "t", 0, 0, 10)
	require.Empty(t, got)
	require.Equal(t, int64(0), next)
}
