package service_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestGroupReadMany covers reads for many consumers of a group in one call:
// GroupRead's validation per consumer, an answer as soon as any consumer
// got records, each consumer's records pending under it, and an exclusive
// group handing records only to the lease holder among them.
func TestGroupReadMany(t *testing.T) {
	e := newEnv(t)
	r := e.start(t, e.config())
	c := r.client

	t.Run("validated like GroupRead", func(t *testing.T) {
		ns := namespace()
		createStream(t, c, ns, "s", 1)
		createGroup(t, c, ns, "s", "g", "-", 0)
		read := func(reads ...*streamsv1.ConsumerRead) error {
			_, err := c.GroupReadMany(t.Context(), &streamsv1.GroupReadManyRequest{Namespace: ns, Stream: "s", Group: "g", Reads: reads})
			return err
		}
		requireCode(t, codes.InvalidArgument, read(), "1 to 1000 consumers")
		tooMany := make([]*streamsv1.ConsumerRead, 1001)
		for i := range tooMany {
			tooMany[i] = &streamsv1.ConsumerRead{Consumer: fmt.Sprintf("c%d", i)}
		}
		requireCode(t, codes.InvalidArgument, read(tooMany...), "1 to 1000 consumers")
		requireCode(t, codes.InvalidArgument, read(&streamsv1.ConsumerRead{Consumer: "ok"}, &streamsv1.ConsumerRead{Consumer: "a/b"}), "consumer")
		requireCode(t, codes.InvalidArgument, read(&streamsv1.ConsumerRead{Consumer: "c", Count: -1}), "count must not be negative")
		_, err := c.GroupReadMany(t.Context(), &streamsv1.GroupReadManyRequest{Namespace: ns, Stream: "s", Group: "nogroup",
			Reads: []*streamsv1.ConsumerRead{{Consumer: "c"}}})
		requireCode(t, codes.NotFound, err, `group "nogroup" not found`)
	})

	t.Run("each consumer gets its own records", func(t *testing.T) {
		ns := namespace()
		createStream(t, c, ns, "s", 2)
		createGroup(t, c, ns, "s", "g", "-", 0)
		reads := []*streamsv1.ConsumerRead{{Consumer: "a", Count: 2}, {Consumer: "b", Count: 2}, {Consumer: "c", Count: 2}, {Consumer: "a", Count: 1}}
		type answer struct {
			resp *streamsv1.GroupReadManyResponse
			err  error
		}
		done := make(chan answer, 1)
		go func() {
			resp, err := c.GroupReadMany(t.Context(), &streamsv1.GroupReadManyRequest{Namespace: ns, Stream: "s", Group: "g", Reads: reads, BlockMs: 30_000})
			done <- answer{resp, err}
		}()
		appended := appendN(t, c, ns, "s", 0, 5)
		var got answer
		select {
		case got = <-done:
		case <-time.After(20 * time.Second):
			require.FailNow(t, "the read was not answered when records came")
		}
		require.NoError(t, got.err)
		results := got.resp.GetResults()
		require.Len(t, results, len(reads), "one result per read, in order")
		owner := map[string]string{}
		for i, res := range results {
			require.Equal(t, reads[i].GetConsumer(), res.GetConsumer())
			require.LessOrEqual(t, len(res.GetRecords()), int(reads[i].GetCount()))
			for _, r := range res.GetRecords() {
				require.NotContains(t, owner, r.GetId(), "a record went to two reads")
				owner[r.GetId()] = res.GetConsumer()
			}
		}
		require.NotEmpty(t, owner)
		require.Subset(t, appended, slices.Collect(maps.Keys(owner)))

		pending, err := c.ListPending(t.Context(), &flov1.ListPendingRequest{Namespace: ns, Stream: "s", Group: "g"})
		require.NoError(t, err)
		require.Len(t, pending.GetEntries(), len(owner))
		for _, p := range pending.GetEntries() {
			require.Equal(t, owner[p.GetId()], p.GetConsumer())
		}
	})

	t.Run("nothing to read", func(t *testing.T) {
		ns := namespace()
		createStream(t, c, ns, "s", 1)
		createGroup(t, c, ns, "s", "g", "$", 0)
		resp, err := c.GroupReadMany(t.Context(), &streamsv1.GroupReadManyRequest{Namespace: ns, Stream: "s", Group: "g",
			Reads: []*streamsv1.ConsumerRead{{Consumer: "a"}, {Consumer: "b"}}, BlockMs: 50})
		require.NoError(t, err)
		require.Len(t, resp.GetResults(), 2)
		for _, res := range resp.GetResults() {
			require.Empty(t, res.GetRecords())
		}
	})

	t.Run("idle reads cost a look a tick, not one each", func(t *testing.T) {
		ns := namespace()
		createStream(t, c, ns, "s", 2)
		createGroup(t, c, ns, "s", "g", "$", 0)
		const readers = 500
		reads := make([]*streamsv1.ConsumerRead, readers)
		for i := range reads {
			reads[i] = &streamsv1.ConsumerRead{Consumer: fmt.Sprintf("c%d", i), Count: 1}
		}
		done := make(chan *streamsv1.GroupReadManyResponse, 1)
		go func() {
			resp, err := c.GroupReadMany(t.Context(), &streamsv1.GroupReadManyRequest{Namespace: ns, Stream: "s", Group: "g", Reads: reads, BlockMs: time.Minute.Milliseconds()})
			if err == nil {
				done <- resp
			}
		}()
		require.Eventually(t, func() bool { return r.svc.Waiters() == 1 }, waitFor, tick)
		probes := r.svc.Probes()
		require.Eventually(t, func() bool { return r.svc.Probes() > probes }, waitFor, tick)
		looks := lookCounter(r)
		probes = r.svc.Probes()
		require.Eventually(t, func() bool { return r.svc.Probes() >= probes+2 }, waitFor, tick)
		looks(t, 10, "over two safety ticks with %d reads waiting in one call", readers)

		appended := appendN(t, c, ns, "s", 0, 3)
		select {
		case resp := <-done:
			var got []string
			for _, res := range resp.GetResults() {
				require.LessOrEqual(t, len(res.GetRecords()), 1)
				got = append(got, ids(res.GetRecords())...)
			}
			require.ElementsMatch(t, appended, got, "three reads got a record each")
		case <-time.After(waitFor):
			require.FailNow(t, "the waiting call got no records")
		}
	})

	t.Run("an exclusive group serves only its holder", func(t *testing.T) {
		ns := namespace()
		createStream(t, c, ns, "s", 1)
		_, err := createModeGroup(t, c, ns, "s", "g", "exclusive")
		require.NoError(t, err)
		appended := appendN(t, c, ns, "s", 0, 6)
		require.Len(t, groupRead(t, c, ns, "s", "g", "a", 2, 0, time.Hour), 2, "a takes the group")
		resp, err := c.GroupReadMany(t.Context(), &streamsv1.GroupReadManyRequest{Namespace: ns, Stream: "s", Group: "g",
			Reads: []*streamsv1.ConsumerRead{{Consumer: "b", Count: 10}, {Consumer: "a", Count: 10}}})
		require.NoError(t, err)
		require.Empty(t, resp.GetResults()[0].GetRecords(), "b reads while a holds the group")
		require.Equal(t, appended[2:], ids(resp.GetResults()[1].GetRecords()), "the holder reads on, in order")
	})
}
