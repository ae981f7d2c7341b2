package service_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func createModeGroup(t *testing.T, c streamsv1.StreamsClient, ns, stream, name, mode string) (*flov1.ConsumerGroup, error) {
	t.Helper()
	return c.CreateGroup(t.Context(), &flov1.CreateGroupRequest{Namespace: ns, Stream: stream, Name: name, Start: "-", Mode: mode})
}

// pendingTotal is how many records group g of stream s has pending.
func pendingTotal(t *testing.T, c streamsv1.StreamsClient, ns string) int64 {
	t.Helper()
	p, err := c.ListPending(t.Context(), &flov1.ListPendingRequest{Namespace: ns, Stream: "s", Group: "g"})
	require.NoError(t, err)
	return p.GetTotal()
}

// testModeValidation: an unknown mode is refused, empty means shared, and
// creating an existing group again is AlreadyExists with its mode and
// FailedPrecondition with another.
func testModeValidation(t *testing.T, c streamsv1.StreamsClient) {
	ns := namespace()
	createStream(t, c, ns, "s", 2)

	_, err := createModeGroup(t, c, ns, "s", "g", "round_robin")
	requireCode(t, codes.InvalidArgument, err, `mode must be "shared", "exclusive" or "key_shared", got "round_robin"`)

	g, err := createModeGroup(t, c, ns, "s", "plain", "")
	require.NoError(t, err)
	require.Equal(t, "shared", g.GetMode())
	_, err = createModeGroup(t, c, ns, "s", "plain", "shared")
	requireCode(t, codes.AlreadyExists, err, `group "plain" already exists`)

	g, err = createModeGroup(t, c, ns, "s", "one", "exclusive")
	require.NoError(t, err)
	require.Equal(t, "exclusive", g.GetMode())
	_, err = createModeGroup(t, c, ns, "s", "one", "exclusive")
	requireCode(t, codes.AlreadyExists, err, `group "one" already exists`)
	_, err = createModeGroup(t, c, ns, "s", "one", "")
	requireCode(t, codes.FailedPrecondition, err, `exists with mode "exclusive", not "shared"`)
	_, err = createModeGroup(t, c, ns, "s", "one", "key_shared")
	requireCode(t, codes.FailedPrecondition, err, `exists with mode "exclusive", not "key_shared"`)

	_, err = createModeGroup(t, c, ns, "s", "keys", "key_shared")
	require.NoError(t, err)
	list, err := c.ListGroups(t.Context(), &flov1.ListGroupsRequest{Namespace: ns, Stream: "s"})
	require.NoError(t, err)
	modes := map[string]string{}
	for _, g := range list.GetGroups() {
		modes[g.GetName()] = g.GetMode()
	}
	require.Equal(t, map[string]string{"keys": "key_shared", "one": "exclusive", "plain": "shared"}, modes)
}

// testExclusiveFailover: the first consumer to read an exclusive group holds
// it, and a second gets nothing while the first keeps reading. When the
// first goes silent past its lease (its message timeout), the second's
// blocked read takes the group over, with the records the first left
// unacked, and the first then gets nothing. Nothing is lost.
func testExclusiveFailover(t *testing.T, c streamsv1.StreamsClient) {
	ns := namespace()
	createStream(t, c, ns, "s", 3)
	_, err := createModeGroup(t, c, ns, "s", "g", "exclusive")
	require.NoError(t, err)
	const total = 100
	appended := appendN(t, c, ns, "s", 0, total)

	const lease = time.Second
	first := groupRead(t, c, ns, "s", "g", "a", 30, 0, lease)
	require.Len(t, first, 30)
	require.Empty(t, groupRead(t, c, ns, "s", "g", "b", 10, 0, time.Hour), "b read while a holds the group")
	more := groupRead(t, c, ns, "s", "g", "a", 10, 0, lease)
	require.Len(t, more, 10, "the holder reads on")
	first = append(first, more...)
	require.Empty(t, groupRead(t, c, ns, "s", "g", "b", 10, 0, time.Hour), "b read while a holds the group")

	// a acks half of what it got and stops reading.
	acked := ids(first[:20])
	require.EqualValues(t, 20, ack(t, c, ns, "s", "g", acked...))
	left := ids(first[20:])

	// b's blocked read waits for a's lease to run out, then takes the group.
	start := time.Now()
	got := groupRead(t, c, ns, "s", "g", "b", total, 30*time.Second, time.Hour)
	require.NotEmpty(t, got)
	require.Less(t, time.Since(start), 20*time.Second, "b waited for its block time, not the lease")
	seen := map[string]int32{}
	for {
		for _, r := range got {
			_, dup := seen[r.GetId()]
			require.False(t, dup, "b got %s twice", r.GetId())
			seen[r.GetId()] = r.GetDeliveryCount()
		}
		ack(t, c, ns, "s", "g", ids(got)...)
		require.Empty(t, groupRead(t, c, ns, "s", "g", "a", 10, 0, lease), "a read after b took over")
		if len(seen) == total-len(acked) {
			break
		}
		got = groupRead(t, c, ns, "s", "g", "b", total, 0, time.Hour)
		require.NotEmpty(t, got, "b stopped getting records with %d of %d", len(seen), total-len(acked))
	}
	for _, id := range left {
		require.EqualValues(t, 2, seen[id], "a's unacked record %s is redelivered to b", id)
	}
	all := append(append([]string{}, acked...), slices.Collect(maps.Keys(seen))...)
	require.ElementsMatch(t, appended, all, "every record acked once")
	require.Zero(t, pendingTotal(t, c, ns), "nothing left pending")
}

// testKeyShared has three consumers read a key_shared group at once while
// records of several keys are appended, each acking what it got in random
// order, or nacking some of it (redelivered at once). Every record is
// processed once, each key's records in append order, a key is never held by
// two consumers at once, and the keys spread over the consumers.
func testKeyShared(t *testing.T, c streamsv1.StreamsClient) {
	ns := namespace()
	createStream(t, c, ns, "s", 3)
	_, err := createModeGroup(t, c, ns, "s", "g", "key_shared")
	require.NoError(t, err)
	const (
		keyCount  = 8
		perAppend = 120
		appends   = 3
		total     = perAppend * appends
		consumers = 3
	)
	appendKeyed := func(from int) {
		req := &flov1.AppendRequest{Namespace: ns, Stream: "s"}
		for i := from; i < from+perAppend; i++ {
			// Record i is the (i / keyCount)-th record of key i % keyCount.
			req.Records = append(req.Records, &flov1.AppendRecord{
				Key: fmt.Sprintf("k%d", i%keyCount), Payload: fmt.Appendf(nil, `{"seq":%d}`, i/keyCount),
			})
		}
		_, err := c.Append(t.Context(), req)
		require.NoError(t, err)
	}
	appendKeyed(0)

	var (
		mu        sync.Mutex
		holder    = map[string]string{} // key -> consumer processing it
		next      = map[string]int{}    // key -> next seq to process
		processed = map[string]int{}    // consumer -> records processed
		seen      = map[string]bool{}
		nacked    = map[string]bool{}
		done      int
		failure   error
		wg        sync.WaitGroup
	)
	fail := func(err error) {
		if failure == nil {
			failure = err
		}
	}
	for w := range consumers {
		consumer := fmt.Sprintf("c%d", w)
		wg.Go(func() {
			for {
				mu.Lock()
				stop := done == total || failure != nil
				mu.Unlock()
				if stop {
					return
				}
				resp, err := c.GroupRead(context.Background(), &flov1.GroupReadRequest{
					Namespace: ns, Stream: "s", Group: "g", Consumer: consumer, Count: 5,
					BlockMs: 200, MessageTimeoutMs: time.Hour.Milliseconds(),
				})
				mu.Lock()
				if err != nil {
					fail(err)
					mu.Unlock()
					return
				}
				recs := resp.GetRecords()
				for _, r := range recs {
					k := r.GetKey()
					if h := holder[k]; h != "" {
						fail(fmt.Errorf("%s got %s of key %s held by %s", consumer, r.GetId(), k, h))
					}
					if seen[r.GetId()] && !nacked[r.GetId()] {
						fail(fmt.Errorf("%s got %s again", consumer, r.GetId()))
					}
					seen[r.GetId()] = true
					delete(nacked, r.GetId())
					holder[k] = consumer
				}
				mu.Unlock()
				rand.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
				for _, r := range recs {
					k := r.GetKey()
					if r.GetDeliveryCount() < 3 && rand.IntN(5) == 0 {
						// Some records fail and come back: their key's later
						// records must still wait for them.
						mu.Lock()
						nacked[r.GetId()] = true
						holder[k] = ""
						mu.Unlock()
						if _, err := c.Nack(context.Background(), &flov1.NackRequest{Namespace: ns, Stream: "s", Group: "g", Ids: []string{r.GetId()}}); err != nil {
							mu.Lock()
							fail(err)
							mu.Unlock()
							return
						}
						continue
					}
					var seq int
					_, _ = fmt.Sscanf(string(r.GetPayload()), `{"seq":%d}`, &seq)
					mu.Lock()
					if seq != next[k] {
						fail(fmt.Errorf("%s processed seq %d of key %s, want %d", consumer, seq, k, next[k]))
					}
					next[k]++
					processed[consumer]++
					done++
					// Done processing: the key is free once acked.
					holder[k] = ""
					mu.Unlock()
					if _, err := c.Ack(context.Background(), &flov1.AckRequest{Namespace: ns, Stream: "s", Group: "g", Ids: []string{r.GetId()}}); err != nil {
						mu.Lock()
						fail(err)
						mu.Unlock()
						return
					}
				}
			}
		})
	}
	for i := 1; i < appends; i++ {
		appendKeyed(i * perAppend)
	}
	wg.Wait()
	require.NoError(t, failure)
	require.Equal(t, total, done)
	for k := range keyCount {
		require.Equal(t, total/keyCount, next[fmt.Sprintf("k%d", k)], "key k%d", k)
	}
	require.GreaterOrEqual(t, len(processed), 2, "keys spread over consumers: %v", processed)
	require.Zero(t, pendingTotal(t, c, ns), "nothing left pending")
}

// testKeySharedRedelivery: a key whose record timed out on one consumer goes
// to the next consumer with that record first, one record of the key at a
// time, and records of held keys wait (parked) while other keys go out.
func testKeySharedRedelivery(t *testing.T, c streamsv1.StreamsClient) {
	ns := namespace()
	createStream(t, c, ns, "s", 1)
	_, err := createModeGroup(t, c, ns, "s", "g", "key_shared")
	require.NoError(t, err)
	req := &flov1.AppendRequest{Namespace: ns, Stream: "s"}
	for i, k := range []string{"a", "a", "b", "a", "b"} {
		req.Records = append(req.Records, &flov1.AppendRecord{Key: k, Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
	}
	resp, err := c.Append(t.Context(), req)
	require.NoError(t, err)
	appended := resp.GetIds()

	// One record per key per read: a's first and b's first.
	got := groupRead(t, c, ns, "s", "g", "x", 10, 0, 500*time.Millisecond)
	require.Equal(t, []string{appended[0], appended[2]}, ids(got))
	// Both keys are held by x: y gets nothing, and the rest is parked.
	require.Empty(t, groupRead(t, c, ns, "s", "g", "y", 10, 0, time.Hour))
	require.EqualValues(t, 5, pendingTotal(t, c, ns), "two handed out, three parked")

	// x acks b's record and goes silent: y gets b's next at once, and a's
	// first again once x's message timeout ran out, before a's later ones.
	ack(t, c, ns, "s", "g", appended[2])
	got = groupRead(t, c, ns, "s", "g", "y", 10, 0, time.Hour)
	require.Equal(t, []string{appended[4]}, ids(got))
	got = groupRead(t, c, ns, "s", "g", "y", 10, 30*time.Second, time.Hour)
	require.Equal(t, []string{appended[0]}, ids(got))
	require.EqualValues(t, 2, got[0].GetDeliveryCount())
	ack(t, c, ns, "s", "g", appended[0], appended[4])
	got = groupRead(t, c, ns, "s", "g", "y", 10, 0, time.Hour)
	require.Equal(t, []string{appended[1]}, ids(got))
	ack(t, c, ns, "s", "g", appended[1])
	got = groupRead(t, c, ns, "s", "g", "x", 10, 0, time.Hour)
	require.Equal(t, []string{appended[3]}, ids(got))
	ack(t, c, ns, "s", "g", appended[3])
	require.Empty(t, groupRead(t, c, ns, "s", "g", "y", 10, 0, time.Hour))
}
