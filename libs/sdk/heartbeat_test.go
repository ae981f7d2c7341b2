package flo_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// streamBeatWorker starts worker id, heartbeating every 10 ms, against a gateway that takes
// heartbeats on the worker stream, and returns once the stream is open.
func streamBeatWorker(t *testing.T, id string) (*peer, *peerStream, *logRecorder, <-chan error) {
	t.Helper()
	p, client := startPeer(t)
	logs := &logRecorder{}
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{WorkerID: id, HeartbeatInterval: 10 * time.Millisecond, Logger: slog.New(logs)})
	require.NoError(t, err)
	w.MustRegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	done := startWorker(t, w)
	ps := p.accept(t)
	ps.handshakeBeats()
	return p, ps, logs, done
}

// handshakeBeats answers the worker's hello saying the stream takes heartbeats.
func (ps *peerStream) handshakeBeats() {
	ps.t.Helper()
	hello := ps.next().GetHello()
	require.NotNil(ps.t, hello, "first message must be a hello")
	ps.send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_HelloAck{HelloAck: &flov1.HelloAck{
		WorkerId: hello.GetWorkerId(), Namespace: hello.GetNamespace(), StreamHeartbeats: true,
	}}})
}

// answerBeat waits for the next Heartbeat, skipping requests for work, and answers it with ack.
func (ps *peerStream) answerBeat(ack *flov1.HeartbeatAck) *flov1.Heartbeat {
	ps.t.Helper()
	hb := ps.nextBeat()
	ps.send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_HeartbeatAck{HeartbeatAck: ack}})
	return hb
}

func (ps *peerStream) nextBeat() *flov1.Heartbeat {
	ps.t.Helper()
	for {
		msg := ps.next()
		if hb := msg.GetHeartbeat(); hb != nil {
			return hb
		}
		require.NotNil(ps.t, msg.GetReady(), "want a heartbeat, got %v", msg)
	}
}

var idle = &flov1.HeartbeatAck{Status: flov1.WorkerStatus_WORKER_STATUS_IDLE}

func TestHeartbeatsGoOnTheStreamWhenTheGatewayTakesThem(t *testing.T) {
	t.Parallel()
	p, ps, logs, done := streamBeatWorker(t, "w-s")
	for range 3 {
		require.Zero(t, ps.answerBeat(idle).GetCurrentLoad())
	}
	require.Zero(t, p.registry.count("heartbeat w-s"), "no heartbeat went as a call of its own")

	// Unknown: the worker registers again.
	ps.answerBeat(&flov1.HeartbeatAck{Unknown: true})
	require.Eventually(t, func() bool { return p.registry.count("register w-s") == 2 }, waitFor, time.Millisecond,
		"the worker did not register again after a heartbeat was answered unknown")

	// Failures are logged at Warn the first time and then once every four in a row; the
	// worker keeps heartbeating on the stream.
	for range 8 {
		ps.answerBeat(&flov1.HeartbeatAck{Error: "recording the heartbeat failed: registry down"})
	}
	ps.answerBeat(idle)
	require.Equal(t, 3, logs.count(slog.LevelWarn, "heartbeat failed"), "warned at failures 1, 4 and 8")
	require.Equal(t, 5, logs.count(slog.LevelDebug, "heartbeat failed"))
	require.Zero(t, p.registry.count("heartbeat w-s"))

	// Draining: the worker drains, closes its stream and deregisters.
	ps.answerBeat(&flov1.HeartbeatAck{Status: flov1.WorkerStatus_WORKER_STATUS_DRAINING})
	for _, msg := range ps.untilClosed() {
		require.Nil(t, msg.GetReady(), "a draining worker asked for work")
	}
	require.NoError(t, requireReturns(t, done))
	calls := p.registry.calls()
	require.Equal(t, "deregister w-s", calls[len(calls)-1])
}

func TestHeartbeatGoesAsACallWhenTheStreamEndsBeforeItsAnswer(t *testing.T) {
	t.Parallel()
	p, ps, _, _ := streamBeatWorker(t, "w-f")
	ps.answerBeat(idle)
	ps.nextBeat()
	ps.end <- status.Error(codes.Unavailable, "gateway restarting")
	require.Eventually(t, func() bool { return p.registry.count("heartbeat w-f") > 0 }, waitFor, time.Millisecond,
		"the heartbeat the stream left unanswered did not go as a call")
	// The next stream takes heartbeats again.
	next := p.accept(t)
	next.handshakeBeats()
	calls := p.registry.count("heartbeat w-f")
	next.answerBeat(idle)
	next.answerBeat(idle)
	require.LessOrEqual(t, p.registry.count("heartbeat w-f"), calls+1, "heartbeats went on the new stream")
}
