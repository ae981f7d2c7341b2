package service_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestStreams runs the tests that share one service, each in its own
// namespace.
func TestStreams(t *testing.T) {
	e := newEnv(t)
	r := e.start(t, e.config())
	for _, tt := range []struct {
		name string
		fn   func(*testing.T, *env, streamsv1.StreamsClient)
	}{
		{"append and read ranges", testAppendAndRead},
		{"tail and follow", testTailAndFollow},
		{"follow while appending", testFollowRace},
		{"follow with next across partitions", testFollowCursor},
		{"retention on the topic", testRetention},
		{"info and lag", testInfo},
		{"delete and recreate", testDeleteStream},
		{"group starts", testGroupStarts},
		{"groups are independent", testIndependentGroups},
		{"ack, nack and delay", testAckNack},
		{"redelivery after the message timeout", testMessageTimeout},
		{"max deliveries to the dead-letter stream", testDeadLetter},
		{"release does not count the delivery", testRelease},
		{"pending list", testPending},
		{"blocked group read is woken", testBlockedGroupRead},
		{"concurrent consumers", testConcurrentConsumers},
		{"bad input", testBadInput},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, e, r.client)
		})
	}
}

func testAppendAndRead(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	st := createStream(t, c, ns, "events", 3)
	require.Equal(t, int32(3), st.GetPartitions())
	require.Equal(t, "events", st.GetName())

	// One record with a key, headers and the caller's trace context, then
	// a batch; REST callers send a JSON value instead of payload bytes.
	traceparent := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	tctx := metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent)
	value, err := structpb.NewValue(map[string]any{"type": "signup", "html": "<b>"})
	require.NoError(t, err)
	first, err := c.Append(tctx, &flov1.AppendRequest{Namespace: ns, Stream: "events", Records: []*flov1.AppendRecord{
		{Value: value, Key: "user-1", Headers: map[string]string{"source": "web", "kind": "a"}},
	}})
	require.NoError(t, err)
	require.Len(t, first.GetIds(), 1)
	batch := appendN(t, c, ns, "events", 0, 300)
	all := append(first.GetIds(), batch...)

	// Ids are unique, and grow with the offset within each partition.
	seen := map[string]bool{}
	last := map[int64]int64{}
	for _, id := range all {
		require.False(t, seen[id], "duplicate id %s", id)
		seen[id] = true
		ms, seq := splitID(t, id)
		require.InDelta(t, time.Now().UnixMilli(), ms, float64(time.Minute.Milliseconds()))
		p := seq % 1000
		if prev, ok := last[p]; ok {
			require.Greater(t, seq, prev)
		}
		last[p] = seq
	}
	require.Len(t, last, 3, "a batch is spread over the partitions")

	// The whole stream, in id order, in pages.
	var got []*flov1.StreamRecord
	start := "-"
	for {
		resp, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "events", Start: start, Count: 70})
		require.NoError(t, err)
		got = append(got, resp.GetRecords()...)
		if len(resp.GetRecords()) < 70 {
			break
		}
		start = resp.GetNext()
		require.True(t, strings.HasPrefix(start, "@"), "next is a cursor: %q", start)
	}
	require.Len(t, got, len(all))
	require.True(t, slices.IsSortedFunc(got, func(a, b *flov1.StreamRecord) int { return compareIDs(t, a.GetId(), b.GetId()) }))
	require.ElementsMatch(t, all, ids(got))

	// The first record kept its key, headers and trace context apart.
	rec := got[slices.IndexFunc(got, func(r *flov1.StreamRecord) bool { return r.GetId() == first.GetIds()[0] })]
	require.Equal(t, "user-1", rec.GetKey())
	require.Equal(t, map[string]string{"source": "web", "kind": "a"}, rec.GetHeaders())
	require.Equal(t, traceparent[:36], rec.GetTraceContext()["traceparent"][:36], "same trace id")
	require.JSONEq(t, `{"type":"signup","html":"<b>"}`, string(rec.GetPayload()))
	require.Equal(t, "signup", rec.GetValue().GetStructValue().GetFields()["type"].GetStringValue())
	require.WithinDuration(t, time.Now(), rec.GetAppendedAt().AsTime(), time.Minute)

	// Records with one key stay in one partition, in order.
	keyed := &flov1.AppendRequest{Namespace: ns, Stream: "events"}
	for i := range 20 {
		keyed.Records = append(keyed.Records, &flov1.AppendRecord{Payload: fmt.Appendf(nil, "%d", i), Key: "same"})
	}
	kresp, err := c.Append(ctx, keyed)
	require.NoError(t, err)
	_, seq0 := splitID(t, kresp.GetIds()[0])
	for _, id := range kresp.GetIds()[1:] {
		_, seq := splitID(t, id)
		require.Equal(t, seq0%1000, seq%1000)
	}

	// A bounded range: inclusive start and end; next is empty once the
	// end is reached.
	from, to := got[10].GetId(), got[19].GetId()
	resp, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "events", Start: from, End: to})
	require.NoError(t, err)
	require.Equal(t, ids(got[10:20]), ids(resp.GetRecords()))
	require.Empty(t, resp.GetNext())
	resp, err = c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "events", Start: "(" + from, End: to, Count: 3})
	require.NoError(t, err)
	require.Equal(t, ids(got[11:14]), ids(resp.GetRecords()))
	resp, err = c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "events", Start: resp.GetNext(), End: to, Count: 100})
	require.NoError(t, err)
	require.Equal(t, ids(got[14:20]), ids(resp.GetRecords()), "the cursor reads on where the last read ended")
	require.Empty(t, resp.GetNext())
}

func testTailAndFollow(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "log", 2)
	// An empty stream: nothing now, and a "$" read times out empty.
	resp, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "log", Tail: 5})
	require.NoError(t, err)
	require.Empty(t, resp.GetRecords())
	resp, err = c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "log", Start: "$", BlockMs: 50})
	require.NoError(t, err)
	require.Empty(t, resp.GetRecords())
	empty := resp.GetNext()

	appended := appendN(t, c, ns, "log", 0, 40)
	resp, err = c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "log", Start: empty})
	require.NoError(t, err)
	require.ElementsMatch(t, appended, ids(resp.GetRecords()), `the next of an empty "$" read is where appends went on`)
	resp, err = c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "log", Tail: 5})
	require.NoError(t, err)
	all, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "log"})
	require.NoError(t, err)
	require.Len(t, all.GetRecords(), 40)
	require.Equal(t, ids(all.GetRecords()[35:]), ids(resp.GetRecords()))
	require.ElementsMatch(t, appended, ids(all.GetRecords()))

	// "$" waits for the next append and is woken by it.
	type result struct {
		resp *flov1.ReadResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "log", Start: "$", BlockMs: waitFor.Milliseconds()})
		done <- result{r, err}
	}()
	// The read may start after the first append; keep appending until
	// it returns.
	var (
		later []string
		res   result
	)
	deadline := time.After(waitFor)
	for res.resp == nil && res.err == nil {
		later = append(later, appendN(t, c, ns, "log", 100+len(later), 1)...)
		select {
		case res = <-done:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("the blocked read was never woken")
		}
	}
	require.NoError(t, res.err)
	require.NotEmpty(t, res.resp.GetRecords())
	for _, r := range res.resp.GetRecords() {
		require.Contains(t, later, r.GetId(), "only records appended after the call")
	}

	// A blocked read from an id returns what comes after it. Ids order
	// records of different partitions by their millisecond only (the
	// sequence is per partition), so the next append must fall in a later
	// millisecond than lastID to be "after" it whichever partition it lands in.
	lastID := later[len(later)-1]
	lastMS, err := strconv.ParseInt(strings.SplitN(lastID, "-", 2)[0], 10, 64)
	require.NoError(t, err)
	for time.Now().UnixMilli() <= lastMS {
		time.Sleep(time.Millisecond)
	}
	go func() {
		r, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "log", Start: "(" + lastID, BlockMs: waitFor.Milliseconds()})
		done <- result{r, err}
	}()
	// Appended before or after the read blocks, the record is after lastID.
	next := appendN(t, c, ns, "log", 1000, 1)
	res = <-done
	require.NoError(t, res.err)
	require.Equal(t, next, ids(res.resp.GetRecords()))

	// Following with next sees every record appended after a read, in
	// whichever partition and millisecond.
	cursor := res.resp.GetNext()
	var followed []string
	appended = appendN(t, c, ns, "log", 2000, 50)
	for len(followed) < len(appended) {
		r, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "log", Start: cursor, Count: 7, BlockMs: waitFor.Milliseconds()})
		require.NoError(t, err)
		require.NotEmpty(t, r.GetRecords())
		followed = append(followed, ids(r.GetRecords())...)
		cursor = r.GetNext()
	}
	require.ElementsMatch(t, appended, followed)
	require.True(t, slices.IsSortedFunc(followed, func(a, b string) int { return compareIDs(t, a, b) }))
}

// testFollowRace starts blocked reads from "(ID" while a record is being
// appended, many times over: however the read's offset lookups and the
// append interleave, the read returns the record.
func testFollowRace(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "race", 2)
	last := appendN(t, c, ns, "race", 0, 1)[0]
	for i := range 200 {
		// The next record must fall in a later millisecond to be after
		// last whichever partition it lands in (see testTailAndFollow).
		ms, err := strconv.ParseInt(strings.SplitN(last, "-", 2)[0], 10, 64)
		require.NoError(t, err)
		for time.Now().UnixMilli() <= ms {
			time.Sleep(100 * time.Microsecond)
		}
		done := make(chan *flov1.ReadResponse, 1)
		go func() {
			r, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "race", Start: "(" + last, BlockMs: waitFor.Milliseconds()})
			assert.NoError(t, err)
			done <- r
		}()
		next := appendN(t, c, ns, "race", i+1, 1)
		res := <-done
		require.Equal(t, next, ids(res.GetRecords()), "iteration %d: read from (%s", i, last)
		last = next[0]
	}
}

// testFollowCursor follows a stream with next across a record that gets a
// smaller id than one read before it: the later record lands in the same
// millisecond in a partition with lower offsets. Records are produced to the
// stream's topic directly, with the timestamps the service would stamp, so
// the millisecond is certain.
func testFollowCursor(t *testing.T, e *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "pair", 2)
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.broker.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	topic := e.topicOf(t, ns, "pair")
	stamp := time.Now().Truncate(time.Millisecond)
	produce := func(partition int32, n int) {
		recs := make([]*kgo.Record, n)
		for i := range recs {
			recs[i] = &kgo.Record{Topic: topic, Partition: partition, Timestamp: stamp, Value: []byte(`{}`)}
		}
		require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
	}

	produce(0, 5)
	first, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "pair"})
	require.NoError(t, err)
	require.Len(t, first.GetRecords(), 5)
	last := first.GetRecords()[4].GetId()
	produce(1, 1)

	byCursor, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "pair", Start: first.GetNext()})
	require.NoError(t, err)
	require.Len(t, byCursor.GetRecords(), 1, "next reads on to the later record")
	later := byCursor.GetRecords()[0].GetId()
	require.Negative(t, compareIDs(t, later, last), "the later record's id is smaller")
	require.Equal(t, int32(1), partitionOf(t, later))

	byID, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "pair", Start: "(" + last})
	require.NoError(t, err)
	require.Empty(t, byID.GetRecords(), "(ID reads ids after ID only")

	// A cursor of another stream or shape is refused.
	_, err = c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "pair", Start: byCursor.GetNext() + ".0"})
	requireCode(t, codes.InvalidArgument, err, "names 3 partitions")
	createStream(t, c, ns, "other", 2)
	_, err = c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "other", Start: byCursor.GetNext()})
	requireCode(t, codes.InvalidArgument, err, "another stream")
}

func testRetention(t *testing.T, e *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	st, err := c.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: ns, Name: "kept", Partitions: 4, RetentionMs: 3_600_000, RetentionBytes: 2 << 20})
	require.NoError(t, err)
	require.Equal(t, int64(3_600_000), st.GetRetentionMs())
	require.Equal(t, int64(2<<20), st.GetRetentionBytes())
	createStream(t, c, ns, "forever", 0)

	cl, err := kgo.NewClient(kgo.SeedBrokers(e.broker.Addrs()...))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topicConfig := func(stream string) (map[string]string, int) {
		topic := e.topicOf(t, ns, stream)
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		require.NoError(t, err)
		cfg := map[string]string{}
		for _, rc := range rcs {
			for _, kv := range rc.Configs {
				if kv.Value != nil {
					cfg[kv.Key] = *kv.Value
				}
			}
		}
		tds, err := adm.ListTopics(ctx, topic)
		require.NoError(t, err)
		return cfg, len(tds[topic].Partitions)
	}
	kept, partitions := topicConfig("kept")
	require.Equal(t, 4, partitions)
	require.Equal(t, "3600000", kept["retention.ms"])
	require.Equal(t, strconv.Itoa(2<<20), kept["retention.bytes"])
	forever, partitions := topicConfig("forever")
	require.Equal(t, 1, partitions, "zero partitions means one")
	require.Equal(t, "-1", forever["retention.ms"])
	require.Equal(t, "-1", forever["retention.bytes"])
}

func testInfo(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "orders", 2)
	info, err := c.GetStream(ctx, &flov1.GetStreamRequest{Namespace: ns, Stream: "orders"})
	require.NoError(t, err)
	require.Zero(t, info.GetLength())
	require.Empty(t, info.GetFirstId())
	require.Empty(t, info.GetLastId())

	appended := appendN(t, c, ns, "orders", 0, 30)
	createGroup(t, c, ns, "orders", "billing", "-", 0)
	createGroup(t, c, ns, "orders", "audit", "$", 0)
	got := groupRead(t, c, ns, "orders", "billing", "c1", 12, 0, time.Minute)
	require.Len(t, got, 12)
	require.Equal(t, int32(4), ack(t, c, ns, "orders", "billing", ids(got[:4])...))

	info, err = c.GetStream(ctx, &flov1.GetStreamRequest{Namespace: ns, Stream: "orders"})
	require.NoError(t, err)
	require.Equal(t, int64(30), info.GetLength())
	sorted := slices.Clone(appended)
	slices.SortFunc(sorted, func(a, b string) int { return compareIDs(t, a, b) })
	require.Equal(t, sorted[0], info.GetFirstId())
	require.Equal(t, sorted[29], info.GetLastId())
	require.Len(t, info.GetGroups(), 2)
	audit, billing := info.GetGroups()[0], info.GetGroups()[1]
	require.Equal(t, "audit", audit.GetName())
	require.Zero(t, audit.GetLag())
	require.Zero(t, audit.GetPending())
	require.Equal(t, "billing", billing.GetName())
	require.Equal(t, int64(18), billing.GetLag())
	require.Equal(t, int64(8), billing.GetPending())
	require.Equal(t, int32(5), billing.GetMaxDeliveries(), "the default")

	list, err := c.ListGroups(ctx, &flov1.ListGroupsRequest{Namespace: ns, Stream: "orders"})
	require.NoError(t, err)
	require.Len(t, list.GetGroups(), 2)
	require.Equal(t, int64(18), list.GetGroups()[1].GetLag())

	streams, err := c.ListStreams(ctx, &flov1.ListStreamsRequest{Namespace: ns})
	require.NoError(t, err)
	require.Len(t, streams.GetStreams(), 1)
	require.Equal(t, "orders", streams.GetStreams()[0].GetName())
}

func testDeleteStream(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "tmp", 1)
	appendN(t, c, ns, "tmp", 0, 5)
	createGroup(t, c, ns, "tmp", "g", "-", 0)
	_, err := c.DeleteStream(ctx, &flov1.GetStreamRequest{Namespace: ns, Stream: "tmp"})
	require.NoError(t, err)
	_, err = c.GetStream(ctx, &flov1.GetStreamRequest{Namespace: ns, Stream: "tmp"})
	requireCode(t, codes.NotFound, err, `stream "tmp" not found`)
	_, err = c.DeleteStream(ctx, &flov1.GetStreamRequest{Namespace: ns, Stream: "tmp"})
	requireCode(t, codes.NotFound, err, `stream "tmp" not found`)

	// Created again under the same name, it starts empty and groupless.
	createStream(t, c, ns, "tmp", 1)
	resp, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "tmp"})
	require.NoError(t, err)
	require.Empty(t, resp.GetRecords())
	list, err := c.ListGroups(ctx, &flov1.ListGroupsRequest{Namespace: ns, Stream: "tmp"})
	require.NoError(t, err)
	require.Empty(t, list.GetGroups())

	createGroup(t, c, ns, "tmp", "g", "-", 0)
	_, err = c.DeleteGroup(ctx, &flov1.GetGroupRequest{Namespace: ns, Stream: "tmp", Group: "g"})
	require.NoError(t, err)
	_, err = c.DeleteGroup(ctx, &flov1.GetGroupRequest{Namespace: ns, Stream: "tmp", Group: "g"})
	requireCode(t, codes.NotFound, err, `group "g" not found on stream "tmp"`)
}

func testGroupStarts(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ns := namespace()
	createStream(t, c, ns, "s", 3)
	before := appendN(t, c, ns, "s", 0, 30)
	all, err := c.Read(t.Context(), &flov1.ReadRequest{Namespace: ns, Stream: "s"})
	require.NoError(t, err)
	mid := all.GetRecords()[12].GetId()

	createGroup(t, c, ns, "s", "from-start", "-", 0)
	createGroup(t, c, ns, "s", "default-start", "", 0)
	createGroup(t, c, ns, "s", "from-end", "$", 0)
	createGroup(t, c, ns, "s", "from-id", mid, 0)
	after := appendN(t, c, ns, "s", 100, 5)

	drain := func(group string) []string {
		var out []string
		for {
			recs := groupRead(t, c, ns, "s", group, "c", 7, 0, time.Minute)
			if len(recs) == 0 {
				return out
			}
			out = append(out, ids(recs)...)
		}
	}
	require.ElementsMatch(t, append(slices.Clone(before), after...), drain("from-start"))
	require.ElementsMatch(t, append(slices.Clone(before), after...), drain("default-start"))
	require.ElementsMatch(t, after, drain("from-end"))
	var want []string
	for _, r := range all.GetRecords()[12:] {
		want = append(want, r.GetId())
	}
	require.ElementsMatch(t, append(want, after...), drain("from-id"))
}

func testIndependentGroups(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ns := namespace()
	createStream(t, c, ns, "s", 2)
	appended := appendN(t, c, ns, "s", 0, 50)
	createGroup(t, c, ns, "s", "a", "-", 0)
	createGroup(t, c, ns, "s", "b", "-", 0)
	var gotA, gotB []string
	for len(gotA) < 50 || len(gotB) < 50 {
		a := groupRead(t, c, ns, "s", "a", "ca", 10, 0, time.Minute)
		b := groupRead(t, c, ns, "s", "b", "cb", 20, 0, time.Minute)
		require.False(t, len(a) == 0 && len(b) == 0, "ran dry at %d and %d", len(gotA), len(gotB))
		gotA = append(gotA, ids(a)...)
		gotB = append(gotB, ids(b)...)
		require.Equal(t, int32(len(a)), ack(t, c, ns, "s", "a", ids(a)...))
	}
	require.ElementsMatch(t, appended, gotA)
	require.ElementsMatch(t, appended, gotB)
	// b never acked: all of b is pending, nothing of a.
	info, err := c.GetStream(t.Context(), &flov1.GetStreamRequest{Namespace: ns, Stream: "s"})
	require.NoError(t, err)
	require.Zero(t, info.GetGroups()[0].GetPending())
	require.Equal(t, int64(50), info.GetGroups()[1].GetPending())
}

func testAckNack(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "s", 1)
	appendN(t, c, ns, "s", 0, 10)
	createGroup(t, c, ns, "s", "g", "-", 0)
	got := groupRead(t, c, ns, "s", "g", "c1", 10, 0, time.Hour)
	require.Len(t, got, 10)
	for _, r := range got {
		require.Equal(t, int32(1), r.GetDeliveryCount())
	}

	// Ack half, one of them twice; only pending records count.
	require.Equal(t, int32(5), ack(t, c, ns, "s", "g", ids(got[:5])...))
	require.Equal(t, int32(0), ack(t, c, ns, "s", "g", got[0].GetId()))
	// Nack two at once and one with a delay.
	nack, err := c.Nack(ctx, &flov1.NackRequest{Namespace: ns, Stream: "s", Group: "g", Ids: ids(got[5:7]), Reason: "boom"})
	require.NoError(t, err)
	require.Equal(t, int32(2), nack.GetNacked())
	nack, err = c.Nack(ctx, &flov1.NackRequest{Namespace: ns, Stream: "s", Group: "g", Ids: []string{got[7].GetId(), got[0].GetId()}, DelayMs: 300})
	require.NoError(t, err)
	require.Equal(t, int32(1), nack.GetNacked(), "an acked record cannot be nacked")

	again := groupRead(t, c, ns, "s", "g", "c2", 10, 0, time.Hour)
	require.Equal(t, ids(got[5:7]), ids(again), "nacked records come back at once, the delayed one later")
	for _, r := range again {
		require.Equal(t, int32(2), r.GetDeliveryCount())
	}
	// The delayed one comes back after its delay to a blocked read.
	delayed := groupRead(t, c, ns, "s", "g", "c3", 10, waitFor, time.Hour)
	require.Equal(t, []string{got[7].GetId()}, ids(delayed))
	require.Equal(t, int32(2), delayed[0].GetDeliveryCount())

	require.Equal(t, int32(5), ack(t, c, ns, "s", "g", append(ids(got[5:10]), "1-999000")...))
	pending, err := c.ListPending(ctx, &flov1.ListPendingRequest{Namespace: ns, Stream: "s", Group: "g"})
	require.NoError(t, err)
	require.Zero(t, pending.GetTotal())
	require.Empty(t, groupRead(t, c, ns, "s", "g", "c1", 10, 0, time.Hour))
}

func testMessageTimeout(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ns := namespace()
	createStream(t, c, ns, "s", 2)
	appendN(t, c, ns, "s", 0, 8)
	createGroup(t, c, ns, "s", "g", "-", 0)
	// c1 takes everything with a short timeout and goes silent.
	silent := groupRead(t, c, ns, "s", "g", "c1", 8, 0, 200*time.Millisecond)
	require.Len(t, silent, 8)
	// c2 blocks and gets them once the timeout passes; it acks them.
	var back []*flov1.StreamRecord
	for len(back) < 8 {
		recs := groupRead(t, c, ns, "s", "g", "c2", 8, waitFor, time.Hour)
		require.NotEmpty(t, recs)
		back = append(back, recs...)
	}
	require.ElementsMatch(t, ids(silent), ids(back))
	for _, r := range back {
		require.Equal(t, int32(2), r.GetDeliveryCount())
	}
	require.Equal(t, int32(8), ack(t, c, ns, "s", "g", ids(back)...))
	// c1's late ack finds nothing pending.
	require.Equal(t, int32(0), ack(t, c, ns, "s", "g", ids(silent)...))
}

// testRelease: records handed back by Release (they never reached a
// worker) come back at once with the same delivery count, so even a group
// of one delivery does not dead-letter them; a nack after that does.
func testRelease(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "jobs", 1)
	appended := appendN(t, c, ns, "jobs", 0, 3)
	createGroup(t, c, ns, "jobs", "once", "-", 1)
	got := groupRead(t, c, ns, "jobs", "once", "gone", 10, 0, time.Hour)
	require.Len(t, got, 3)

	released, err := c.Release(ctx, &streamsv1.ReleaseRequest{Namespace: ns, Stream: "jobs", Group: "once", Ids: append(ids(got[:2]), "0-999"), Reason: "not delivered"})
	require.NoError(t, err)
	require.Equal(t, int32(2), released.GetNacked(), "only pending records are released")
	again := groupRead(t, c, ns, "jobs", "once", "next", 10, 0, time.Hour)
	require.Equal(t, appended[:2], ids(again), "released records come back at once")
	for _, r := range again {
		require.Equal(t, int32(1), r.GetDeliveryCount(), "the released delivery was not counted")
	}

	_, err = c.Nack(ctx, &flov1.NackRequest{Namespace: ns, Stream: "jobs", Group: "once", Ids: ids(again), Reason: "failed"})
	require.NoError(t, err)
	require.Empty(t, groupRead(t, c, ns, "jobs", "once", "next", 10, 0, time.Hour), "a counted delivery used the group's one")
	dlq, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "jobs.dlq"})
	require.NoError(t, err)
	require.Len(t, dlq.GetRecords(), 2)
}

func testDeadLetter(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "jobs", 2)
	appended := appendN(t, c, ns, "jobs", 0, 3)
	createGroup(t, c, ns, "jobs", "workers", "-", 2)
	ok := appended[0]
	// Deliveries 1 and 2 fail; the third attempt moves the records to
	// jobs.dlq instead.
	for attempt := 1; attempt <= 2; attempt++ {
		recs := groupRead(t, c, ns, "jobs", "workers", "c", 10, waitFor, time.Hour)
		var fail []string
		for _, r := range recs {
			require.Equal(t, int32(attempt), r.GetDeliveryCount())
			if r.GetId() == ok {
				require.Equal(t, int32(1), ack(t, c, ns, "jobs", "workers", ok))
				continue
			}
			fail = append(fail, r.GetId())
		}
		require.Len(t, fail, 2)
		// The last nack asks for a long delay, which is skipped.
		delay := int64(0)
		if attempt == 2 {
			delay = 3_600_000
		}
		_, err := c.Nack(ctx, &flov1.NackRequest{Namespace: ns, Stream: "jobs", Group: "workers", Ids: fail, Reason: fmt.Sprintf("failure %d", attempt), DelayMs: delay})
		require.NoError(t, err)
	}
	require.Empty(t, groupRead(t, c, ns, "jobs", "workers", "c", 10, 0, time.Hour))
	pending, err := c.ListPending(ctx, &flov1.ListPendingRequest{Namespace: ns, Stream: "jobs", Group: "workers"})
	require.NoError(t, err)
	require.Zero(t, pending.GetTotal(), "dead-lettered records are acked")

	dlq, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "jobs.dlq"})
	require.NoError(t, err)
	require.Len(t, dlq.GetRecords(), 2)
	var sources []string
	for _, r := range dlq.GetRecords() {
		h := r.GetHeaders()
		sources = append(sources, h["flo-source-id"])
		require.Equal(t, "workers", h["flo-group"])
		require.Equal(t, "2", h["flo-deliveries"])
		require.Equal(t, "failure 2", h["flo-error"])
	}
	require.ElementsMatch(t, appended[1:], sources)
	info, err := c.GetStream(ctx, &flov1.GetStreamRequest{Namespace: ns, Stream: "jobs.dlq"})
	require.NoError(t, err)
	require.Equal(t, int32(1), info.GetStream().GetPartitions())
}

func testPending(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "s", 2)
	appendN(t, c, ns, "s", 0, 12)
	createGroup(t, c, ns, "s", "g", "-", 0)
	a := groupRead(t, c, ns, "s", "g", "alice", 5, 0, time.Hour)
	b := groupRead(t, c, ns, "s", "g", "bob", 7, 0, time.Hour)
	require.Len(t, a, 5)
	require.Len(t, b, 7)
	ack(t, c, ns, "s", "g", a[0].GetId())
	_, err := c.Nack(ctx, &flov1.NackRequest{Namespace: ns, Stream: "s", Group: "g", Ids: []string{b[0].GetId()}, DelayMs: 3_600_000})
	require.NoError(t, err)

	all, err := c.ListPending(ctx, &flov1.ListPendingRequest{Namespace: ns, Stream: "s", Group: "g"})
	require.NoError(t, err)
	require.Equal(t, int64(11), all.GetTotal())
	require.Len(t, all.GetEntries(), 11)
	// By partition, then offset: the order the page token resumes in.
	require.True(t, slices.IsSortedFunc(all.GetEntries(), func(x, y *flov1.PendingEntry) int {
		_, xseq := splitID(t, x.GetId())
		_, yseq := splitID(t, y.GetId())
		return cmp.Or(cmp.Compare(xseq%1000, yseq%1000), cmp.Compare(xseq/1000, yseq/1000))
	}))
	byID := map[string]*flov1.PendingEntry{}
	for _, e := range all.GetEntries() {
		byID[e.GetId()] = e
		require.Equal(t, int32(1), e.GetDeliveryCount())
		require.True(t, e.GetRedeliverAt().AsTime().After(e.GetDeliveredAt().AsTime()))
	}
	require.NotContains(t, byID, a[0].GetId())
	require.Equal(t, "alice", byID[a[1].GetId()].GetConsumer())
	require.Equal(t, "", byID[b[0].GetId()].GetConsumer(), "a nacked record waits for any consumer")
	require.Equal(t, "bob", byID[b[1].GetId()].GetConsumer())

	// Alice's records, two a page, are those of the whole list, in order.
	var alices, paged []string
	for _, e := range all.GetEntries() {
		if e.GetConsumer() == "alice" {
			alices = append(alices, e.GetId())
		}
	}
	token := ""
	for {
		alice, err := c.ListPending(ctx, &flov1.ListPendingRequest{Namespace: ns, Stream: "s", Group: "g", Consumer: "alice", Limit: 2, PageToken: token})
		require.NoError(t, err)
		require.Equal(t, int64(4), alice.GetTotal())
		require.LessOrEqual(t, len(alice.GetEntries()), 2)
		for _, e := range alice.GetEntries() {
			paged = append(paged, e.GetId())
		}
		if token = alice.GetNextPageToken(); token == "" {
			break
		}
	}
	require.Equal(t, alices, paged)
}

func testBlockedGroupRead(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ns := namespace()
	createStream(t, c, ns, "s", 2)
	createGroup(t, c, ns, "s", "g", "$", 0)
	require.Empty(t, groupRead(t, c, ns, "s", "g", "c", 5, 30*time.Millisecond, time.Hour), "times out empty")

	done := make(chan []*flov1.StreamRecord, 1)
	go func() {
		resp, err := c.GroupRead(context.Background(), &flov1.GroupReadRequest{
			Namespace: ns, Stream: "s", Group: "g", Consumer: "c", Count: 5, BlockMs: waitFor.Milliseconds(),
		})
		if err != nil {
			done <- nil
			return
		}
		done <- resp.GetRecords()
	}()
	// Appended before or after the read blocks, the group (at "$" since
	// before) gets them.
	appended := appendN(t, c, ns, "s", 0, 3)
	got := <-done
	require.NotEmpty(t, got)
	for _, id := range ids(got) {
		require.Contains(t, appended, id)
	}
}

func testConcurrentConsumers(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ns := namespace()
	createStream(t, c, ns, "s", 4)
	createGroup(t, c, ns, "s", "g", "-", 0)
	const total = 3000
	var appended []string
	for i := 0; i < total; i += 500 {
		appended = append(appended, appendN(t, c, ns, "s", i, 500)...)
	}
	type tally struct {
		got   []string
		acked int32
	}
	results := make(chan tally, 3)
	for w := range 3 {
		go func() {
			var tl tally
			for {
				resp, err := c.GroupRead(context.Background(), &flov1.GroupReadRequest{
					Namespace: ns, Stream: "s", Group: "g", Consumer: fmt.Sprintf("w%d", w), Count: 50, BlockMs: 200,
				})
				if err != nil {
					t.Error(err)
					break
				}
				if len(resp.GetRecords()) == 0 {
					break
				}
				tl.got = append(tl.got, ids(resp.GetRecords())...)
				a, err := c.Ack(context.Background(), &flov1.AckRequest{Namespace: ns, Stream: "s", Group: "g", Ids: ids(resp.GetRecords())})
				if err != nil {
					t.Error(err)
					break
				}
				tl.acked += a.GetAcked()
			}
			results <- tl
		}()
	}
	var got []string
	var acked int32
	for range 3 {
		tl := <-results
		got = append(got, tl.got...)
		acked += tl.acked
	}
	require.Len(t, got, total, "each record handed out once")
	require.ElementsMatch(t, appended, got)
	require.Equal(t, int32(total), acked, "each record acked once")
}

func testBadInput(t *testing.T, _ *env, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "s", 1)
	createGroup(t, c, ns, "s", "g", "-", 0)
	appendN(t, c, ns, "s", 0, 1)
	big := make([]byte, maxRecord+1)
	for _, tt := range []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"unknown stream", func() error {
			_, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "nope"})
			return err
		}, codes.NotFound, `stream "nope" not found in namespace "` + ns + `"`},
		{"append to unknown stream", func() error {
			_, err := c.Append(ctx, &flov1.AppendRequest{Namespace: ns, Stream: "nope", Records: []*flov1.AppendRecord{{Payload: []byte("x")}}})
			return err
		}, codes.NotFound, `stream "nope" not found`},
		{"unknown group", func() error {
			_, err := c.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: ns, Stream: "s", Group: "nope", Consumer: "c"})
			return err
		}, codes.NotFound, `group "nope" not found on stream "s"`},
		{"ack on unknown group", func() error {
			_, err := c.Ack(ctx, &flov1.AckRequest{Namespace: ns, Stream: "s", Group: "nope", Ids: []string{"1-0"}})
			return err
		}, codes.NotFound, `group "nope" not found`},
		{"group on unknown stream", func() error {
			_, err := c.CreateGroup(ctx, &flov1.CreateGroupRequest{Namespace: ns, Stream: "nope", Name: "g"})
			return err
		}, codes.NotFound, `stream "nope" not found`},
		{"stream exists", func() error {
			_, err := c.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: ns, Name: "s"})
			return err
		}, codes.AlreadyExists, `stream "s" already exists`},
		{"group exists", func() error {
			_, err := c.CreateGroup(ctx, &flov1.CreateGroupRequest{Namespace: ns, Stream: "s", Name: "g"})
			return err
		}, codes.AlreadyExists, `group "g" already exists`},
		{"malformed start", func() error {
			_, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "s", Start: "x"})
			return err
		}, codes.InvalidArgument, `invalid record id "x": want <ms>-<seq>`},
		{"malformed group start", func() error {
			_, err := c.CreateGroup(ctx, &flov1.CreateGroupRequest{Namespace: ns, Stream: "s", Name: "g2", Start: "12"})
			return err
		}, codes.InvalidArgument, `invalid record id "12"`},
		{"malformed ack id", func() error {
			_, err := c.Ack(ctx, &flov1.AckRequest{Namespace: ns, Stream: "s", Group: "g", Ids: []string{"1-1", "bad"}})
			return err
		}, codes.InvalidArgument, `ids[1]: invalid record id "bad"`},
		{"oversized record", func() error {
			_, err := c.Append(ctx, &flov1.AppendRequest{Namespace: ns, Stream: "s", Records: []*flov1.AppendRecord{{Payload: []byte("ok")}, {Payload: big}}})
			return err
		}, codes.InvalidArgument, fmt.Sprintf("records[1].payload is %d bytes, over the limit of %d", maxRecord+1, maxRecord)},
		{"empty append", func() error {
			_, err := c.Append(ctx, &flov1.AppendRequest{Namespace: ns, Stream: "s"})
			return err
		}, codes.InvalidArgument, "at least one record"},
		{"reserved header", func() error {
			_, err := c.Append(ctx, &flov1.AppendRequest{Namespace: ns, Stream: "s", Records: []*flov1.AppendRecord{{Payload: []byte("x"), Headers: map[string]string{"traceparent": "x"}}}})
			return err
		}, codes.InvalidArgument, `"traceparent" is reserved`},
		{"short retention", func() error {
			_, err := c.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: ns, Name: "r", RetentionMs: 1000})
			return err
		}, codes.InvalidArgument, "retention_ms must be 0 (keep forever) or at least 60000"},
		{"small retention bytes", func() error {
			_, err := c.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: ns, Name: "r", RetentionBytes: 1000})
			return err
		}, codes.InvalidArgument, "retention_bytes must be 0 (no limit) or at least 1048576"},
		{"too many partitions", func() error {
			_, err := c.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: ns, Name: "r", Partitions: 257})
			return err
		}, codes.InvalidArgument, "partitions must be between 1 and 256, got 257"},
		{"bad stream name", func() error {
			_, err := c.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: ns, Name: ".hidden"})
			return err
		}, codes.InvalidArgument, `name ".hidden" is invalid`},
		{"no consumer", func() error {
			_, err := c.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: ns, Stream: "s", Group: "g"})
			return err
		}, codes.InvalidArgument, "consumer is required"},
		{"bad max deliveries", func() error {
			_, err := c.CreateGroup(ctx, &flov1.CreateGroupRequest{Namespace: ns, Stream: "s", Name: "g3", MaxDeliveries: -1})
			return err
		}, codes.InvalidArgument, "max_deliveries must be between 1 and 1000"},
		{"tail with start", func() error {
			_, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "s", Tail: 3, Start: "-"})
			return err
		}, codes.InvalidArgument, "tail cannot be combined"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			requireCode(t, tt.code, tt.call(), tt.msg)
		})
	}
	// Nothing bad was stored.
	streams, err := c.ListStreams(ctx, &flov1.ListStreamsRequest{Namespace: ns})
	require.NoError(t, err)
	require.Len(t, streams.GetStreams(), 1)
	resp, err := c.Read(ctx, &flov1.ReadRequest{Namespace: ns, Stream: "s"})
	require.NoError(t, err)
	require.Len(t, resp.GetRecords(), 1, "a refused append appends nothing")
}

func splitID(t *testing.T, id string) (int64, int64) {
	t.Helper()
	msText, seqText, ok := strings.Cut(id, "-")
	require.True(t, ok, id)
	ms, err := strconv.ParseInt(msText, 10, 64)
	require.NoError(t, err)
	seq, err := strconv.ParseInt(seqText, 10, 64)
	require.NoError(t, err)
	return ms, seq
}

func compareIDs(t *testing.T, a, b string) int {
	ams, aseq := splitID(t, a)
	bms, bseq := splitID(t, b)
	if ams != bms {
		return int(ams - bms)
	}
	return int(aseq - bseq)
}

// partitionOf is the partition a record id names.
func partitionOf(t *testing.T, id string) int32 {
	_, seq := splitID(t, id)
	return int32(seq % 1000)
}
