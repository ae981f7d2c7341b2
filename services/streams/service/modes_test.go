package service_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestGroupModes covers how exclusive and key_shared groups hand records to
// their consumers (shared groups are the rest of the package's tests).
func TestGroupModes(t *testing.T) {
	e := newEnv(t)
	r := e.start(t, e.config())
	for _, tt := range []struct {
		name string
		fn   func(*testing.T, streamsv1.StreamsClient)
	}{
		{"mode is validated and kept", testModeValidation},
		{"exclusive group fails over", testExclusiveFailover},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, r.client)
		})
	}
}

func createModeGroup(t *testing.T, c streamsv1.StreamsClient, ns, stream, name, mode string) (*flov1.ConsumerGroup, error) {
	t.Helper()
	return c.CreateGroup(t.Context(), &flov1.CreateGroupRequest{Namespace: ns, Stream: stream, Name: name, Start: "-", Mode: mode})
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

	info, err := c.ListPending(context.Background(), &flov1.ListPendingRequest{Namespace: ns, Stream: "s", Group: "g"})
	require.NoError(t, err)
	require.Zero(t, info.GetTotal())
}
