package workerstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// workerKey names a worker the way worker event records are keyed.
func workerKey(namespace, workerID string) string { return namespace + "/" + workerID }

func (s *Server) track(sess *session) {
	key := workerKey(sess.namespace, sess.workerID)
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	set := s.sessions[key]
	if set == nil {
		set = make(map[*session]struct{})
		s.sessions[key] = set
	}
	set[sess] = struct{}{}
}

func (s *Server) untrackLocked(sess *session) {
	key := workerKey(sess.namespace, sess.workerID)
	delete(s.sessions[key], sess)
	if len(s.sessions[key]) == 0 {
		delete(s.sessions, key)
	}
}

func (s *Server) serves(key string) bool {
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	return len(s.sessions[key]) > 0
}

// DrainWorker makes every stream this server holds open for the worker
// draining: no more claims, no more tasks sent, a Drain message to the
// worker. Reports keep flowing so it can finish what it holds. Draining a
// worker without a stream here, or one already draining, does nothing.
func (s *Server) DrainWorker(namespace, workerID string) {
	s.sessionsMu.Lock()
	set := s.sessions[workerKey(namespace, workerID)]
	sessions := make([]*session, 0, len(set))
	for sess := range set {
		sessions = append(sessions, sess)
	}
	s.sessionsMu.Unlock()
	for _, sess := range sessions {
		sess.startWorkerDrain()
	}
}

// WorkerEventsHandler returns the batch handler of the worker-events tail: a
// worker turning DRAINING is drained on the streams this server holds.
// Records about workers without a stream here are skipped without decoding;
// one that does not decode is returned as kafka.Poison, which the tail logs,
// counts and skips.
func (s *Server) WorkerEventsHandler() func(ctx context.Context, records []*kgo.Record) error {
	return func(_ context.Context, records []*kgo.Record) error {
		var poison []error
		for _, rec := range records {
			if !s.serves(string(rec.Key)) {
				continue
			}
			var ev eventsv1.WorkerEvent
			if err := proto.Unmarshal(rec.Value, &ev); err != nil {
				poison = append(poison, kafka.Poison(rec, fmt.Errorf("decode WorkerEvent: %w", err)))
				continue
			}
			if ev.GetStatus() == flov1.WorkerStatus_WORKER_STATUS_DRAINING {
				s.DrainWorker(ev.GetNamespace(), ev.GetWorkerId())
			}
		}
		return errors.Join(poison...)
	}
}

// startWorkerDrain switches the session to draining, once. The flag is set
// before anything else, and the writer checks it before sending each task
// or record batch, so no task or record goes out after the Drain message:
// batches still queued and tasks a claim returns later are abandoned
// instead, records nacked. Outstanding stream reads are answered empty after
// the Drain message.
func (s *session) startWorkerDrain() {
	s.drainOnce.Do(func() {
		s.workerDraining.Store(true)
		s.dropCredit()
		s.log.InfoContext(s.ctx, "worker draining: no new tasks or records")
		// Not inline: the caller may be the events tail or an API call, which
		// must not wait for one slow worker's send queue.
		s.ops.Go(func() {
			s.enqueue(outgoing{msg: &flov1.ServerMessage{Msg: &flov1.ServerMessage_Drain{Drain: &flov1.Drain{}}}})
			s.closeReads(true)
		})
	})
}

// dropCredit forgets every pool's credit and tells their hubs, which see
// the drain and want nothing more.
func (s *session) dropCredit() {
	s.poolsMu.Lock()
	defer s.poolsMu.Unlock()
	for _, p := range s.pools {
		p.clear()
		p.signal()
	}
}

// checkRegistry asks the registry whether the worker is draining already (a
// drain may have been asked for while it had no stream) and drains the
// session if so. Any other answer, or none in time, changes nothing.
func (s *session) checkRegistry() {
	reg := s.srv.opts.Registry
	if reg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, registryCheckTimeout)
	defer cancel()
	w, err := reg.GetWorker(ctx, &flov1.GetWorkerRequest{Namespace: s.namespace, WorkerId: s.workerID})
	if err != nil {
		s.log.DebugContext(ctx, "registry did not say whether the worker is draining", slog.Any("error", err))
		return
	}
	if w.GetStatus() == flov1.WorkerStatus_WORKER_STATUS_DRAINING {
		s.startWorkerDrain()
	}
}
