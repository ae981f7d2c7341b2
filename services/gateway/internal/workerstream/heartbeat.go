package workerstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/status"

	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Heartbeats on the stream. Each worker heartbeats every 30 s or so; as
// unary calls that is a stream, a handler, a span and a registry call per
// heartbeat, which at 10,000 idle workers was most of what they cost.
// Instead a session hands its worker's Heartbeat to one queue per gateway,
// served by a goroutine that runs only while heartbeats wait: it sends what
// is queued as one registry Heartbeats call, and what arrives meanwhile
// forms the next call.
const (
	// heartbeatQueue bounds the heartbeats waiting for a call; past it a
	// session's reader waits, which pushes back on its worker.
	heartbeatQueue = 10_000
	// maxHeartbeatCall caps the heartbeats of one Heartbeats call.
	maxHeartbeatCall = 1000
	// heartbeatCallTimeout bounds one Heartbeats call; a heartbeat left
	// unrecorded is answered with an error and the next one tries again.
	heartbeatCallTimeout = 10 * time.Second
)

// errNoRegistry answers heartbeats on a gateway configured without a
// registry client at all.
const errNoRegistry = "no worker registry is configured"

// beat is a session's heartbeat waiting for its Heartbeats call.
type beat struct {
	sess *session
	req  *flov1.HeartbeatRequest
}

// noWait is a closed channel: a put given it does not wait for room.
var noWait = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// heartbeat queues the worker's Heartbeat for the next Heartbeats call,
// waiting while the queue is full.
func (s *session) heartbeat(hb *flov1.Heartbeat) {
	s.srv.beats.put(beat{sess: s, req: &flov1.HeartbeatRequest{
		Namespace: s.namespace, WorkerId: s.workerID,
		CurrentLoad: hb.GetCurrentLoad(), CpuLoad: hb.GetCpuLoad(), MemoryLoad: hb.GetMemoryLoad(),
	}}, s.ctx.Done())
}

// answerHeartbeat queues a HeartbeatAck for the writer. The heartbeat queue
// answers every session of a call in turn and must not wait for one slow
// worker's full queue: then a goroutine of the session waits instead.
func (s *session) answerHeartbeat(ack *flov1.HeartbeatAck) {
	item := outgoing{msg: &flov1.ServerMessage{Msg: &flov1.ServerMessage_HeartbeatAck{HeartbeatAck: ack}}}
	if !s.out.put(item, noWait) {
		s.ops.Go(func() { s.enqueue(item) })
	}
}

// recordHeartbeats serves the heartbeat queue: first and what else is
// queued, up to maxHeartbeatCall, go to the registry as one call, and each
// session gets its worker's answer. A draining worker's streams are drained
// here, as when a unary heartbeat is answered draining.
func (s *Server) recordHeartbeats(first beat) {
	batch := []beat{first}
	for len(batch) < maxHeartbeatCall {
		b, ok := s.beats.next()
		if !ok {
			break
		}
		batch = append(batch, b)
	}
	acks, err := s.callHeartbeats(batch)
	if err != nil {
		s.opts.Log.Debug("recording heartbeats failed", slog.Int("heartbeats", len(batch)), slog.Any("error", err))
	}
	for i, b := range batch {
		ack := &flov1.HeartbeatAck{}
		if err != nil {
			ack.Error = "recording the heartbeat failed: " + err.Error()
		} else {
			ack = acks[i]
		}
		if ack.GetStatus() == flov1.WorkerStatus_WORKER_STATUS_DRAINING {
			s.DrainWorker(b.sess.namespace, b.sess.workerID)
		}
		b.sess.answerHeartbeat(ack)
	}
}

// callHeartbeats makes the registry call of a batch and returns one answer
// per heartbeat.
func (s *Server) callHeartbeats(batch []beat) ([]*flov1.HeartbeatAck, error) {
	if s.opts.Registry == nil {
		return nil, errors.New(errNoRegistry)
	}
	req := &registryv1.HeartbeatsRequest{Heartbeats: make([]*flov1.HeartbeatRequest, len(batch))}
	for i, b := range batch {
		req.Heartbeats[i] = b.req
	}
	ctx, cancel := context.WithTimeout(context.Background(), heartbeatCallTimeout)
	defer cancel()
	resp, err := s.opts.Registry.Heartbeats(ctx, req)
	if err != nil {
		return nil, errors.New(status.Convert(err).Message())
	}
	if n := len(resp.GetAcks()); n != len(batch) {
		return nil, fmt.Errorf("the registry answered %d of %d heartbeats", n, len(batch))
	}
	return resp.GetAcks(), nil
}
