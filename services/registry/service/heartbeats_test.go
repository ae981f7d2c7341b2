package service_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// testHeartbeats sends one Heartbeats call, as a gateway batches its
// streams' heartbeats: each is answered in order, an unknown worker's with
// unknown and an invalid one with its own error while the others are
// recorded; a drained worker hears it.
func testHeartbeats(t *testing.T, e *env) {
	ctx := t.Context()
	ns := namespace()
	for _, id := range []string{"w1", "w2", "w3"} {
		register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: id})
	}
	_, err := e.client.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: "w3"})
	require.NoError(t, err)
	before := getWorker(t, e.client, ns, "w1").GetLastHeartbeat().AsTime()

	resp, err := e.client.Heartbeats(ctx, &registryv1.HeartbeatsRequest{Heartbeats: []*flov1.HeartbeatRequest{
		{Namespace: ns, WorkerId: "w1", CurrentLoad: 4},
		{Namespace: ns, WorkerId: "nobody", CurrentLoad: 1},
		{Namespace: ns, WorkerId: "w2", CurrentLoad: -1},
		{Namespace: ns, WorkerId: "w2"},
		{Namespace: ns, WorkerId: "w3", CurrentLoad: 2},
	}})
	require.NoError(t, err)
	acks := resp.GetAcks()
	require.Len(t, acks, 5)
	require.Equal(t, stActive, acks[0].GetStatus())
	require.True(t, acks[1].GetUnknown(), "%v", acks[1])
	require.Contains(t, acks[2].GetError(), "current_load -1 must not be negative")
	require.Equal(t, stIdle, acks[3].GetStatus())
	require.Equal(t, stDraining, acks[4].GetStatus())
	for _, ack := range []*flov1.HeartbeatAck{acks[0], acks[3], acks[4]} {
		require.False(t, ack.GetUnknown())
		require.Empty(t, ack.GetError())
	}

	w1 := getWorker(t, e.client, ns, "w1")
	require.EqualValues(t, 4, w1.GetCurrentLoad())
	require.False(t, w1.GetLastHeartbeat().AsTime().Before(before))
	require.EqualValues(t, 2, getWorker(t, e.client, ns, "w3").GetCurrentLoad())

	_, err = e.client.Heartbeats(ctx, &registryv1.HeartbeatsRequest{Heartbeats: make([]*flov1.HeartbeatRequest, 10_001)})
	requireCode(t, codes.InvalidArgument, err, "10001 heartbeats in one call, at most 10000")
}
