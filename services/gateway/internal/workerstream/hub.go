package workerstream

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	backoffretry "github.com/razorbill/flo/libs/retry"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

const (
	// maxRounds caps the claim rounds one hub has in flight: enough for a
	// busy hub to keep claiming while a round waits or records its leases.
	maxRounds = 4
	// maxRoundTasks caps the tasks one round asks for, the dispatcher's cap
	// on one claim.
	maxRoundTasks = 1000
)

// hubs are a Server's claim hubs by key; the zero value is ready.
type hubs struct {
	mu    sync.Mutex
	byKey map[string]*hub
}

// hub claims for every pool of one namespace, action set and lease length
// on this gateway, so that any number of idle workers cost one waiting
// Claim call, not one each. Pools tell it what they want; it runs claim
// rounds, each asking for the wants of the pools waiting longest (a slot
// per worker, maxRoundTasks in all), and hands each task to the pool of
// the worker the dispatcher leased it to. The slot-to-pool mapping is the
// round's own, so two streams of one worker id (a worker reconnecting)
// never get each other's tasks: they are never in one round together.
//
// A hub runs goroutines (runners, one round at a time each) only while
// some pool waits. While its rounds wait for work, a pool that starts
// waiting joins the next round, which comes as soon as tasks do; only a
// hub whose last round brought tasks, or whose rounds are full, runs more
// rounds at once, up to maxRounds.
type hub struct {
	srv       *Server
	key       string
	namespace string
	actions   []string
	leaseMS   int64
	log       *slog.Logger
	// members counts the pools of the hub; guarded by srv.hubs.mu.
	members int

	mu sync.Mutex
	// queue holds the pools that want more than the rounds in flight ask
	// for them, longest waiting first; a pool that stopped wanting
	// meanwhile is skipped when its turn comes.
	queue   []*pool
	rounds  []*round
	runners int
	// busy says the last round that ended brought tasks.
	busy bool
}

// round is one Claim call for some pools' wants.
type round struct {
	ctx     context.Context
	cancel  context.CancelFunc
	entries []entry
	// byWorker is the entry of each worker id in the claim's slots.
	byWorker map[string]int
	total    int
	// live counts the entries whose pool still wants tasks, present those
	// whose pool has not stopped; guarded by the hub's mu.
	live, present int
}

// entry is one pool's slot in a round.
type entry struct {
	p     *pool
	count int
}

// hub returns the hub of a pool's key, made if needed, with the pool
// counted as one of its members.
func (s *Server) hub(namespace string, actions []string, leaseMS int64) *hub {
	key := namespace + "\x00" + poolKey(actions, leaseMS)
	s.hubs.mu.Lock()
	defer s.hubs.mu.Unlock()
	h := s.hubs.byKey[key]
	if h == nil {
		if s.hubs.byKey == nil {
			s.hubs.byKey = make(map[string]*hub)
		}
		h = &hub{srv: s, key: key, namespace: namespace, actions: actions, leaseMS: leaseMS,
			log: s.opts.Log.With(slog.String("namespace", namespace), slog.Any("actions", actions))}
		s.hubs.byKey[key] = h
	}
	h.members++
	return h
}

// leave forgets a member of h, and h once it has none: rounds still in
// flight end on their own, abandoning what they bring.
func (s *Server) leave(h *hub) {
	s.hubs.mu.Lock()
	defer s.hubs.mu.Unlock()
	if h.members--; h.members == 0 && s.hubs.byKey[h.key] == h {
		delete(s.hubs.byKey, h.key)
	}
}

// stop takes the pool of a session that stopped claiming out of the hub.
// A round that no longer has any pool present is cancelled.
func (h *hub) stop(p *pool) {
	h.mu.Lock()
	p.stopped = true
	h.setWantLocked(p, 0)
	for _, r := range p.rounds {
		if r.present--; r.present == 0 {
			r.cancel()
		}
	}
	start := h.startLocked()
	h.mu.Unlock()
	if start {
		go h.run()
	}
	p.mu.Lock()
	p.stopTimerLocked()
	p.mu.Unlock()
	h.srv.leave(h)
}

// refresh recomputes what p wants and starts a round for it if one should.
func (h *hub) refresh(p *pool) {
	now := time.Now()
	h.mu.Lock()
	h.updateLocked(p, now)
	start := h.startLocked()
	h.mu.Unlock()
	if start {
		go h.run()
	}
}

// wantLocked is how many tasks p can take now: its credit, at most its
// session's room, and nothing once it stopped or its worker drains.
func (h *hub) wantLocked(p *pool, now time.Time) int {
	if p.stopped || p.s.workerDraining.Load() {
		return 0
	}
	return min(p.credit(), p.s.held.room(now))
}

// updateLocked recomputes p's want and queues p when it wants more than
// the rounds in flight ask for it.
func (h *hub) updateLocked(p *pool, now time.Time) {
	h.setWantLocked(p, h.wantLocked(p, now))
	if p.want > p.inFlight && !p.queued {
		p.queued = true
		h.queue = append(h.queue, p)
	}
}

// setWantLocked sets p's want, keeping the live counts of its rounds.
func (h *hub) setWantLocked(p *pool, want int) {
	if (want > 0) != (p.want > 0) {
		d := 1
		if want == 0 {
			d = -1
		}
		for _, r := range p.rounds {
			r.live += d
		}
	}
	p.want = want
}

// startLocked says whether to start a runner for the queue, counting it:
// when none runs, or when the rounds in flight are busy or full. Otherwise
// the queue waits for a round to end, and a round that no pool in it
// wants any more is ended now.
func (h *hub) startLocked() bool {
	if len(h.queue) == 0 {
		return false
	}
	if h.runners == 0 || h.runners < maxRounds && (h.busy || h.fullLocked()) {
		h.runners++
		return true
	}
	for _, r := range h.rounds {
		if r.live == 0 {
			r.cancel()
		}
	}
	return false
}

// fullLocked says whether every round in flight asks for maxRoundTasks.
func (h *hub) fullLocked() bool {
	for _, r := range h.rounds {
		if r.total < maxRoundTasks {
			return false
		}
	}
	return len(h.rounds) > 0
}

// run makes rounds until the queue is empty. A dispatcher that is down or
// restarting is retried with backoff; the workers' streams stay open
// meanwhile.
func (h *hub) run() {
	b := dispatcherRetry.Backoff()
	for {
		r := h.next()
		if r == nil {
			return
		}
		resp, err := h.claim(r)
		if err != nil && errors.Is(r.ctx.Err(), context.Canceled) {
			// Ended by the hub: its pools left or stopped wanting.
			err = nil
		}
		h.finish(r, resp, err)
		if err == nil {
			b.Reset()
			continue
		}
		if permanent(err) {
			for _, e := range r.entries {
				e.p.s.fail(err)
			}
		} else {
			h.log.Warn("claim tasks failed; retrying", slog.Int("workers", len(r.entries)), slog.Any("error", err))
		}
		backoffretry.Sleep(context.Background(), b.NextBackOff())
	}
}

// next takes a round's worth of wants from the queue, longest waiting
// first; it returns nil, and counts the runner out, when none is left.
func (h *hub) next() *round {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	r := &round{}
	var later []*pool
	for len(h.queue) > 0 && r.total < maxRoundTasks {
		p := h.queue[0]
		h.setWantLocked(p, h.wantLocked(p, now))
		ask := p.want - p.inFlight
		if ask > 0 && r.has(p.s.workerID) {
			// Another stream of the worker is in this round: the next
			// round takes this one.
			later = append(later, p)
			ask = 0
		} else if ask > 0 {
			n := min(ask, maxRoundTasks-r.total)
			r.add(p, n)
			if n < ask {
				break
			}
		}
		p.queued = false
		h.queue = h.queue[1:]
	}
	if len(later) > 0 {
		for _, p := range later {
			p.queued = true
		}
		h.queue = append(later, h.queue...)
	}
	if len(h.queue) == 0 {
		h.queue = nil
	}
	if len(r.entries) == 0 {
		h.runners--
		return nil
	}
	r.ctx, r.cancel = context.WithTimeout(context.Background(), maxClaimWait+claimSlack)
	h.rounds = append(h.rounds, r)
	return r
}

func (r *round) has(workerID string) bool {
	_, ok := r.byWorker[workerID]
	return ok
}

func (r *round) add(p *pool, n int) {
	if r.byWorker == nil {
		r.byWorker = make(map[string]int)
	}
	r.byWorker[p.s.workerID] = len(r.entries)
	r.entries = append(r.entries, entry{p: p, count: n})
	r.total += n
	r.live++
	r.present++
	p.inFlight += n
	p.rounds = append(p.rounds, r)
}

// claim makes the round's Claim call: a slot per pool, waiting up to
// maxClaimWait for work.
func (h *hub) claim(r *round) (*dispatcherv1.ClaimResponse, error) {
	slots := make([]*dispatcherv1.ClaimSlot, len(r.entries))
	for i, e := range r.entries {
		slots[i] = &dispatcherv1.ClaimSlot{WorkerId: e.p.s.workerID, Count: int32(e.count)}
	}
	return h.srv.opts.Claimer.Claim(r.ctx, &dispatcherv1.ClaimRequest{
		Namespace: h.namespace,
		Actions:   h.actions,
		Slots:     slots,
		WaitMs:    maxClaimWait.Milliseconds(),
		LeaseMs:   h.leaseMS,
	}, func(resp *dispatcherv1.ClaimResponse) { h.late(r, resp) })
}

// finish hands a round's tasks to the pools of their workers, abandons
// those no pool takes, and puts the round's pools back in the queue when
// they want more.
func (h *hub) finish(r *round, resp *dispatcherv1.ClaimResponse, err error) {
	now := time.Now()
	rest, _ := r.route(resp, now)
	r.cancel()
	h.mu.Lock()
	h.rounds = slices.DeleteFunc(h.rounds, func(o *round) bool { return o == r })
	for _, e := range r.entries {
		p := e.p
		p.inFlight -= e.count
		p.rounds = slices.DeleteFunc(p.rounds, func(o *round) bool { return o == r })
		h.updateLocked(p, now)
	}
	if err == nil && resp != nil {
		h.busy = len(resp.GetTasks()) > 0
	}
	h.mu.Unlock()
	h.abandon(rest)
}

// late hands out the tasks of an answer that came after the round's (from
// another replica) to the pools of their workers that can still take them,
// and abandons the rest.
func (h *hub) late(r *round, resp *dispatcherv1.ClaimResponse) {
	rest, took := r.route(resp, time.Now())
	for _, p := range took {
		p.signal()
	}
	h.abandon(rest)
}

// route hands each task of resp to the pool of the round's slot of its
// worker; it returns the tasks no pool took and the pools that took some.
func (r *round) route(resp *dispatcherv1.ClaimResponse, now time.Time) (rest []*flov1.TaskAssignment, took []*pool) {
	tasks, workers := resp.GetTasks(), resp.GetWorkerIds()
	if len(tasks) == 0 {
		return nil, nil
	}
	got := make([][]*flov1.TaskAssignment, len(r.entries))
	for i, t := range tasks {
		j, ok := -1, false
		if i < len(workers) {
			j, ok = r.byWorker[workers[i]]
		}
		if !ok {
			rest = append(rest, t)
			continue
		}
		got[j] = append(got[j], t)
	}
	for j, ts := range got {
		if len(ts) == 0 {
			continue
		}
		p := r.entries[j].p
		left := p.take(ts, now)
		if len(left) < len(ts) {
			took = append(took, p)
		}
		rest = append(rest, left...)
	}
	return rest, took
}

// abandon hands back tasks no worker received, without counting an
// attempt: tasks of a round (or a late answer) no pool could take.
func (h *hub) abandon(tasks []*flov1.TaskAssignment) {
	if len(tasks) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	req := &dispatcherv1.ReportRequest{Namespace: h.namespace, Reports: abandonReports(tasks)}
	var resp *dispatcherv1.ReportResponse
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = h.srv.dispatcher.Report(ctx, req)
		return err
	})
	if err != nil || len(resp.GetRejectedTaskIds()) > 0 {
		h.log.Warn("abandon unsent tasks failed; they return to the queue when their lease expires",
			slog.Int("tasks", len(tasks)), slog.Int("rejected", len(resp.GetRejectedTaskIds())), slog.Any("error", err))
	}
}

// abandonReports are the Abandon reports of tasks.
func abandonReports(tasks []*flov1.TaskAssignment) []*dispatcherv1.Report {
	reports := make([]*dispatcherv1.Report, len(tasks))
	for i, t := range tasks {
		reports[i] = &dispatcherv1.Report{
			TaskId: t.GetTaskId(), Attempt: t.GetAttempt(),
			Kind: &dispatcherv1.Report_Abandon{Abandon: &flov1.Abandon{TaskId: t.GetTaskId(), Attempt: t.GetAttempt()}},
		}
	}
	return reports
}
