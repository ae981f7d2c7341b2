package service_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// beat sends a Heartbeat on the stream and returns its HeartbeatAck, and a Drain if one came
// first.
func (w *rawWorker) beat(t *testing.T, load int32) (ack *flov1.HeartbeatAck, drained bool) {
	t.Helper()
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Heartbeat{Heartbeat: &flov1.Heartbeat{CurrentLoad: load}}})
	for {
		m := w.next(t)
		if m.GetDrain() != nil {
			drained = true
			continue
		}
		require.NotNil(t, m.GetHeartbeatAck(), "want a HeartbeatAck, got %v", m)
		return m.GetHeartbeatAck(), drained
	}
}

// TestHeartbeatsOnTheWorkerStream heartbeats on the streams of three registered workers and
// one the registry does not know: each is recorded with its load and answered with its
// status, the unknown one with unknown; a drain recorded at the registry comes back in the
// answer and drains the stream; the unary heartbeat still works.
func TestHeartbeatsOnTheWorkerStream(t *testing.T) {
	s := startRegistryStack(t)
	ctx := testContext(t)
	ids := []string{"w-1", "w-2", "w-3"}
	streams := map[string]*rawWorker{}
	for _, id := range ids {
		_, err := s.registry.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{Namespace: "default", WorkerId: id, WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION})
		require.NoError(t, err)
		streams[id] = openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: id, Namespace: "default", Actions: []string{"job"}})
	}
	stranger := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w-unknown", Namespace: "default", Actions: []string{"job"}})

	for i, id := range ids {
		streams[id].send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Heartbeat{Heartbeat: &flov1.Heartbeat{CurrentLoad: int32(i)}}})
	}
	for i, id := range ids {
		ack := streams[id].next(t).GetHeartbeatAck()
		require.NotNil(t, ack)
		want := flov1.WorkerStatus_WORKER_STATUS_ACTIVE
		if i == 0 {
			want = flov1.WorkerStatus_WORKER_STATUS_IDLE
		}
		require.Equal(t, want, ack.GetStatus(), id)
		require.False(t, ack.GetUnknown())
		require.Empty(t, ack.GetError())
		w, err := s.registry.GetWorker(ctx, &flov1.GetWorkerRequest{Namespace: "default", WorkerId: id})
		require.NoError(t, err)
		require.EqualValues(t, i, w.GetCurrentLoad())
		require.False(t, w.GetLastHeartbeat().AsTime().Before(w.GetRegisteredAt().AsTime()))
	}
	ack, _ := stranger.beat(t, 0)
	require.True(t, ack.GetUnknown(), "%v", ack)

	// A drain recorded at the registry directly, as through another gateway replica.
	direct := registryv1.NewRegistryClient(dialInternal(t, s.registryAddr))
	_, err := direct.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: "default", WorkerId: "w-1"})
	require.NoError(t, err)
	ack, drained := streams["w-1"].beat(t, 0)
	require.Equal(t, flov1.WorkerStatus_WORKER_STATUS_DRAINING, ack.GetStatus())
	if !drained {
		require.NotNil(t, streams["w-1"].next(t).GetDrain(), "the stream of a draining worker got no Drain")
	}

	resp, err := s.registry.Heartbeat(ctx, &flov1.HeartbeatRequest{Namespace: "default", WorkerId: "w-2", CurrentLoad: 7})
	require.NoError(t, err)
	require.Equal(t, flov1.WorkerStatus_WORKER_STATUS_ACTIVE, resp.GetStatus())
	w, err := s.registry.GetWorker(ctx, &flov1.GetWorkerRequest{Namespace: "default", WorkerId: "w-2"})
	require.NoError(t, err)
	require.EqualValues(t, 7, w.GetCurrentLoad())
}

// TestStreamHeartbeatsWithoutARegistry heartbeats on a gateway whose registry is down: each
// heartbeat is answered with an error and the stream carries on.
func TestStreamHeartbeatsWithoutARegistry(t *testing.T) {
	s := startStack(t)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w", Namespace: "default", Actions: []string{"job"}})
	for range 2 {
		ack, _ := w.beat(t, 1)
		require.Contains(t, ack.GetError(), "recording the heartbeat failed")
		require.False(t, ack.GetUnknown())
	}
	id := invoke(t, s, "job", `{}`)
	w.ready(t, 1, 600_000)
	require.Equal(t, id, w.tasks(t, 1)[0].GetTaskId())
}
