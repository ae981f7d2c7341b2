package workerstream

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	backoffretry "github.com/razorbill/flo/libs/retry"
	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

const (
	// maxReadRounds caps the read rounds one hub has in flight beyond its
	// full ones: enough for a busy group's consumers to keep reading while
	// a round waits.
	maxReadRounds = 4
	// maxRoundReads caps the reads of one round, the streams service's cap
	// on one GroupReadMany.
	maxRoundReads = 1000
	// maxRoundWait bounds one round's wait, so reads that came while it
	// waits join a call within that time even when no record comes (an
	// exclusive group's holder may be among them).
	maxRoundWait = 10 * time.Second
)

// readHubs are a Server's read hubs by key; mu guards them and every hub's
// state. The zero value is ready.
type readHubs struct {
	mu    sync.Mutex
	byKey map[string]*readHub
}

// readHub reads for every StreamRead of one namespace, stream, group and
// block time on this gateway, so that any number of idle stream workers
// cost one waiting GroupReadMany, not a GroupRead each. Reads wait in its
// queue; runners (goroutines only while reads wait) make rounds, each one
// GroupReadMany for up to maxRoundReads queued reads, and answer each read
// with its consumer's records through finishRead. While a round waits for
// records, new reads join the next round, which comes as soon as records
// do (or within maxRoundWait); only a hub whose last round brought records,
// or whose rounds are full, runs more rounds at once.
type readHub struct {
	key                      string
	namespace, stream, group string
	queue                    []*hubRead
	rounds                   []*readRound
	runners                  int
	// busy says the last round that ended brought records.
	busy bool
}

// readRound is one GroupReadMany for some reads, waiting as long as the
// longest of them (at most maxRoundWait).
type readRound struct {
	reads  []*hubRead
	wait   time.Duration
	ctx    context.Context
	cancel context.CancelFunc
}

// hubRead is one StreamRead waiting in a hub. Its timer answers it with an
// empty batch at its block time if no round answered it before.
type hubRead struct {
	s     *session
	sub   *subscription
	rc    *readCall
	end   time.Time
	timer *time.Timer
	// answered says the read got its answer (or is getting it).
	answered bool
}

// hubRead hands read rc of sub to the hub of its group, made if needed.
func (s *Server) hubRead(sess *session, sub *subscription, rc *readCall) {
	key := sess.namespace + "\x00" + sub.stream + "\x00" + sub.group + "\x00" + strconv.FormatInt(rc.block.Milliseconds(), 10)
	r := &hubRead{s: sess, sub: sub, rc: rc, end: time.Now().Add(rc.block)}
	s.readHubs.mu.Lock()
	if sess.readsShut.Load() {
		// The session stopped reading since the read was taken: a read
		// queued now would take records for no one.
		s.readHubs.mu.Unlock()
		return
	}
	rc.queued = r
	h := s.readHubs.byKey[key]
	if h == nil {
		if s.readHubs.byKey == nil {
			s.readHubs.byKey = make(map[string]*readHub)
		}
		h = &readHub{key: key, namespace: sess.namespace, stream: sub.stream, group: sub.group}
		s.readHubs.byKey[key] = h
	}
	h.queue = append(h.queue, r)
	r.timer = time.AfterFunc(rc.block, func() { s.expireRead(r) })
	start := h.startLocked()
	s.readHubs.mu.Unlock()
	if start && !s.reads.Go(func() { s.runReads(h) }) {
		// Closed: nothing reads any more.
		s.readHubs.mu.Lock()
		h.runners--
		queued := h.queue
		h.queue = nil
		s.forgetHubLocked(h)
		for _, q := range queued {
			q.answered = true
			q.timer.Stop()
		}
		s.readHubs.mu.Unlock()
		for _, q := range queued {
			q.s.finishRead(q.sub, q.rc, nil)
		}
	}
}

// dropReads takes the reads of a session that stopped reading out of their
// hubs, so that no later round takes records for them: each would hold
// records back from the live consumers until it is released. A round
// already waiting for one goes on; records it brings for it are released
// at once, their delivery not counted.
func (s *Server) dropReads(rcs []*readCall) {
	s.readHubs.mu.Lock()
	defer s.readHubs.mu.Unlock()
	for _, rc := range rcs {
		if r := rc.queued; r != nil && !r.answered {
			r.answered = true
			r.timer.Stop()
		}
	}
}

// startLocked says whether to start a runner for the queue, counting it:
// when none runs, when the last round brought records (up to
// maxReadRounds), or when every round in flight is full.
func (h *readHub) startLocked() bool {
	if len(h.queue) == 0 {
		return false
	}
	full := 0
	for _, rd := range h.rounds {
		if len(rd.reads) == maxRoundReads {
			full++
		}
	}
	if h.runners == 0 || h.busy && h.runners < full+maxReadRounds || full == h.runners {
		h.runners++
		return true
	}
	return false
}

// forgetHubLocked drops h once nothing waits in it or runs for it.
func (s *Server) forgetHubLocked(h *readHub) {
	if len(h.queue) == 0 && h.runners == 0 && s.readHubs.byKey[h.key] == h {
		delete(s.readHubs.byKey, h.key)
	}
}

// expireRead answers read r with an empty batch at its block time, unless a
// round answered it. A round it is in goes on (it ends by then): records
// it brings for r are released.
func (s *Server) expireRead(r *hubRead) {
	s.readHubs.mu.Lock()
	answered := r.answered
	r.answered = true
	s.readHubs.mu.Unlock()
	if !answered {
		r.s.finishRead(r.sub, r.rc, nil)
	}
}

// runReads makes rounds until the hub's queue is empty. A streams service
// that is down or restarting is retried with backoff; the reads' timers
// answer them meanwhile.
func (s *Server) runReads(h *readHub) {
	b := dispatcherRetry.Backoff()
	for {
		rd := s.nextRound(h)
		if rd == nil {
			return
		}
		resp, err := s.readRound(h, rd)
		s.finishRound(h, rd, resp, err)
		switch {
		case err == nil:
			b.Reset()
			continue
		case s.readCtx.Err() != nil:
			continue
		case permanent(err):
			for _, r := range rd.reads {
				r.s.fail(status.Convert(err).Err())
			}
		default:
			s.opts.Log.Warn("group read failed; retrying", slog.String("namespace", h.namespace),
				slog.String("stream", h.stream), slog.String("group", h.group), slog.Int("reads", len(rd.reads)), slog.Any("error", err))
		}
		backoffretry.Sleep(s.readCtx, b.NextBackOff())
	}
}

// nextRound takes up to maxRoundReads reads from the queue, longest waiting
// first; it returns nil, and counts the runner out, when none is left.
// Reads answered by their timer meanwhile are dropped; a read whose session
// ended still reads until its block time, as it would had its call begun,
// so that records it brings are released at once.
func (s *Server) nextRound(h *readHub) *readRound {
	s.readHubs.mu.Lock()
	defer s.readHubs.mu.Unlock()
	h.queue = slices.DeleteFunc(h.queue, func(r *hubRead) bool { return r.answered })
	n := min(len(h.queue), maxRoundReads)
	if n == 0 || s.readCtx.Err() != nil {
		h.runners--
		s.forgetHubLocked(h)
		return nil
	}
	rd := &readRound{reads: slices.Clone(h.queue[:n])}
	h.queue = slices.Delete(h.queue, 0, n)
	if len(h.queue) == 0 {
		h.queue = nil
	}
	var end time.Time
	for _, r := range rd.reads {
		if r.end.After(end) {
			end = r.end
		}
	}
	rd.wait = min(max(time.Until(end), 0), maxRoundWait)
	rd.ctx, rd.cancel = context.WithTimeout(s.readCtx, rd.wait+readSlack)
	h.rounds = append(h.rounds, rd)
	return rd
}

// readRound makes the round's GroupReadMany.
func (s *Server) readRound(h *readHub, rd *readRound) (*streamsv1.GroupReadManyResponse, error) {
	defer rd.cancel()
	req := &streamsv1.GroupReadManyRequest{Namespace: h.namespace, Stream: h.stream, Group: h.group,
		Reads: make([]*streamsv1.ConsumerRead, len(rd.reads)), BlockMs: rd.wait.Milliseconds()}
	for i, r := range rd.reads {
		req.Reads[i] = &streamsv1.ConsumerRead{Consumer: r.sub.consumer, Count: r.rc.req.GetCount(), MessageTimeoutMs: r.rc.req.GetMessageTimeoutMs()}
	}
	return s.opts.Streams.GroupReadMany(rd.ctx, req)
}

// finishRound answers the round's reads that got records (a read answered
// meanwhile has them nacked by finishRead) and queues the others that still
// wait again, longest waiting first.
func (s *Server) finishRound(h *readHub, rd *readRound, resp *streamsv1.GroupReadManyResponse, err error) {
	results := resp.GetResults()
	got := make([][]*flov1.StreamRecord, len(rd.reads))
	if err == nil {
		for i := range min(len(results), len(rd.reads)) {
			got[i] = results[i].GetRecords()
		}
	}
	var again []*hubRead
	s.readHubs.mu.Lock()
	h.rounds = slices.DeleteFunc(h.rounds, func(o *readRound) bool { return o == rd })
	brought := false
	now := time.Now()
	for i, r := range rd.reads {
		if len(got[i]) > 0 {
			brought = true
			if !r.answered {
				r.answered = true
				r.timer.Stop()
			}
			continue
		}
		// A read past its block time is left to its timer.
		if !r.answered && now.Before(r.end) && s.readCtx.Err() == nil && (err == nil || !permanent(err)) {
			again = append(again, r)
		}
	}
	if err == nil {
		h.busy = brought
	}
	h.queue = append(again, h.queue...)
	s.readHubs.mu.Unlock()
	for i, r := range rd.reads {
		if len(got[i]) > 0 {
			r.s.finishRead(r.sub, r.rc, got[i])
		}
	}
}
