package service_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestGroupReads covers what concurrent group reads share: a transaction
// for the reads of one group that wait at the same time, and the groups a
// replica remembers between reads; and how the modes of a group (see
// modes_test.go) spread its records over consumers.
func TestGroupReads(t *testing.T) {
	e := newEnv(t)
	r := e.start(t, e.config())
	for _, tt := range []struct {
		name string
		fn   func(*testing.T, streamsv1.StreamsClient)
	}{
		{"concurrent reads share transactions", testConcurrentReadsShare},
		{"group deleted while remembered", testGroupDeletedWhileRemembered},
		{"group mode is validated and kept", testModeValidation},
		{"exclusive group fails over", testExclusiveFailover},
		{"key_shared group keeps keys in order on one consumer", testKeyShared},
		{"key_shared redelivers a key's record first", testKeySharedRedelivery},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, r.client)
		})
	}
}

// testConcurrentReadsShare has many consumers read one group at once, so
// that reads share transactions: first new records, then the same records
// again once a nack handed them back. Each record goes to one consumer per
// round, and the pending list names the consumer that got it.
func testConcurrentReadsShare(t *testing.T, c streamsv1.StreamsClient) {
	ns := namespace()
	createStream(t, c, ns, "s", 3)
	createGroup(t, c, ns, "s", "g", "-", 0)
	const (
		total     = 600
		consumers = 8
	)
	appended := appendN(t, c, ns, "s", 0, total)

	// round reads until every record was handed out in it, each consumer
	// asking for a different count, and returns who got which.
	round := func(deliveries int32) map[string]string {
		var (
			mu      sync.Mutex
			owner   = map[string]string{}
			twice   []string
			counts  []int32
			wg      sync.WaitGroup
			readErr error
		)
		for w := range consumers {
			consumer := fmt.Sprintf("c%d", w)
			wg.Go(func() {
				for {
					mu.Lock()
					done := len(owner) >= total || readErr != nil
					mu.Unlock()
					if done {
						return
					}
					resp, err := c.GroupRead(context.Background(), &flov1.GroupReadRequest{
						Namespace: ns, Stream: "s", Group: "g", Consumer: consumer, Count: int32(3 + w*5),
						BlockMs: 200, MessageTimeoutMs: time.Hour.Milliseconds(),
					})
					mu.Lock()
					readErr = cmp.Or(readErr, err)
					for _, r := range resp.GetRecords() {
						if _, ok := owner[r.GetId()]; ok {
							twice = append(twice, r.GetId())
						}
						if r.GetDeliveryCount() != deliveries {
							counts = append(counts, r.GetDeliveryCount())
						}
						owner[r.GetId()] = consumer
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		require.NoError(t, readErr)
		require.Empty(t, twice, "handed out twice in one round")
		require.Empty(t, counts, "delivery counts other than %d", deliveries)
		require.ElementsMatch(t, appended, slices.Collect(maps.Keys(owner)))
		return owner
	}
	checkPending := func(owner map[string]string) {
		resp, err := c.ListPending(t.Context(), &flov1.ListPendingRequest{Namespace: ns, Stream: "s", Group: "g", Limit: total})
		require.NoError(t, err)
		require.Len(t, resp.GetEntries(), total)
		var wrong []string
		for _, e := range resp.GetEntries() {
			if owner[e.GetId()] != e.GetConsumer() {
				wrong = append(wrong, e.GetId())
			}
		}
		require.Empty(t, wrong, "pending under another consumer than the one that got it")
	}

	first := round(1)
	checkPending(first)
	nacked, err := c.Nack(t.Context(), &flov1.NackRequest{Namespace: ns, Stream: "s", Group: "g", Ids: appended})
	require.NoError(t, err)
	require.Equal(t, int32(total), nacked.GetNacked())
	second := round(2)
	checkPending(second)
	require.Equal(t, int32(total), ack(t, c, ns, "s", "g", appended...))
}

// testGroupDeletedWhileRemembered reads and acks a group that was deleted,
// and created again, after the service looked it up.
func testGroupDeletedWhileRemembered(t *testing.T, c streamsv1.StreamsClient) {
	ctx := t.Context()
	ns := namespace()
	createStream(t, c, ns, "s", 1)
	appended := appendN(t, c, ns, "s", 0, 3)
	createGroup(t, c, ns, "s", "g", "-", 0)
	got := groupRead(t, c, ns, "s", "g", "c", 2, 0, time.Hour)
	require.Equal(t, appended[:2], ids(got))

	_, err := c.DeleteGroup(ctx, &flov1.GetGroupRequest{Namespace: ns, Stream: "s", Group: "g"})
	require.NoError(t, err)
	_, err = c.Ack(ctx, &flov1.AckRequest{Namespace: ns, Stream: "s", Group: "g", Ids: ids(got)})
	requireCode(t, codes.NotFound, err, `group "g" not found`)
	_, err = c.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: ns, Stream: "s", Group: "g", Consumer: "c"})
	requireCode(t, codes.NotFound, err, `group "g" not found`)

	// Created again, it is a new group that starts where it is told.
	createGroup(t, c, ns, "s", "g", "-", 0)
	again := groupRead(t, c, ns, "s", "g", "c", 10, 0, time.Hour)
	require.Equal(t, appended, ids(again))
	require.Equal(t, int32(1), again[0].GetDeliveryCount())
	require.Equal(t, int32(3), ack(t, c, ns, "s", "g", appended...))
}
