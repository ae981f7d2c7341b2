package workerstream

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// grant is the credit one Ready gave: up to remaining tasks until deadline.
type grant struct {
	remaining int
	deadline  time.Time
}

// grants are a pool's credit. Grants are used oldest first; a grant whose
// deadline passes with credit left is dropped and answered with one empty
// TaskBatch, which tells the worker to send that Ready again. A worker can
// mirror this bookkeeping exactly because it sees the same messages in the
// same order.
type grants struct {
	list   []grant
	credit int
}

// add records a Ready's credit, clamped so the pool never holds more than
// maxCredit; it reports whether it added any.
func (g *grants) add(count int, deadline time.Time) bool {
	count = min(count, maxCredit-g.credit)
	if count <= 0 {
		return false
	}
	g.list = append(g.list, grant{remaining: count, deadline: deadline})
	g.credit += count
	return true
}

// expire drops the grants whose deadline passed. It returns how many it
// dropped, the credit left and the earliest deadline among the grants left.
func (g *grants) expire(now time.Time) (expired, credit int, next time.Time) {
	kept := g.list[:0]
	for _, gr := range g.list {
		if !now.Before(gr.deadline) {
			expired++
			g.credit -= gr.remaining
			continue
		}
		if next.IsZero() || gr.deadline.Before(next) {
			next = gr.deadline
		}
		kept = append(kept, gr)
	}
	clear(g.list[len(kept):])
	g.list = kept
	if len(kept) == 0 {
		g.list = nil
	}
	return expired, g.credit, next
}

// consume uses n credit, oldest grants first.
func (g *grants) consume(n int) {
	g.credit -= n
	i := 0
	for ; i < len(g.list) && n > 0; i++ {
		use := min(n, g.list[i].remaining)
		g.list[i].remaining -= use
		n -= use
		if g.list[i].remaining > 0 {
			break
		}
	}
	g.list = slices.Delete(g.list, 0, i)
	if g.credit < 0 {
		g.credit = 0
	}
}

// pool is one session's credit for one combination of actions and lease
// length. It runs no goroutine: its want, min(credit, room), is claimed by
// the hub of its key together with the other pools of that key on this
// gateway, and the hub hands it the tasks leased to its worker (take). A
// timer answers grants that expire (expire); tasks and those answers go to
// the writer in the order they happened, through outbox.
type pool struct {
	s       *session
	h       *hub
	actions []string
	leaseMS int64

	mu     sync.Mutex
	grants grants
	// timer fires at timerAt, no later than the earliest grant deadline.
	timer   *time.Timer
	timerAt time.Time
	// outbox holds what goes to the writer next; flushing says a goroutine
	// (of s.claimers) is moving it there, so the hub never waits for a
	// worker's send queue.
	outbox   []outgoing
	flushing bool

	// Guarded by h.mu: what the pool wants claimed, how much of it rounds in
	// flight ask for, whether it waits in h's queue, whether it stopped
	// (its session stopped claiming), and the rounds it is in.
	want     int
	inFlight int
	queued   bool
	stopped  bool
	rounds   []*round
}

func newPool(s *session, h *hub, actions []string, leaseMS int64) *pool {
	return &pool{s: s, h: h, actions: actions, leaseMS: leaseMS}
}

// poolKey names a pool: its lease length and its sorted action names.
func poolKey(actions []string, leaseMS int64) string {
	return strconv.FormatInt(leaseMS, 10) + "\x00" + strings.Join(actions, "\x00")
}

// signal tells the hub that the pool's want may have changed.
func (p *pool) signal() { p.h.refresh(p) }

// add records a Ready's credit and arms the timer for its deadline.
func (p *pool) add(count int, deadline time.Time) {
	p.mu.Lock()
	if p.grants.add(count, deadline) {
		p.armLocked(deadline)
	}
	p.mu.Unlock()
	p.signal()
}

// clear drops every grant, for a worker that gets nothing more.
func (p *pool) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.grants = grants{}
	p.stopTimerLocked()
}

// credit is the credit the pool has left.
func (p *pool) credit() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.grants.credit
}

// armLocked makes the timer fire no later than at.
func (p *pool) armLocked(at time.Time) {
	if !p.timerAt.IsZero() && !at.Before(p.timerAt) {
		return
	}
	p.timerAt = at
	if p.timer == nil {
		p.timer = time.AfterFunc(time.Until(at), p.expire)
		return
	}
	p.timer.Reset(time.Until(at))
}

func (p *pool) stopTimerLocked() {
	if p.timer != nil {
		p.timer.Stop()
	}
	p.timerAt = time.Time{}
}

// expire drops the grants whose deadline passed, answers each with an
// empty TaskBatch, as the worker expects, and arms the timer for the next.
func (p *pool) expire() {
	now := time.Now()
	p.mu.Lock()
	p.timerAt = time.Time{}
	expired, _, next := p.grants.expire(now)
	if expired > 0 {
		items := make([]outgoing, expired)
		for i := range items {
			items[i] = outgoing{msg: emptyBatch()}
		}
		// A session that ended gets nothing more: no answer is owed.
		p.pushLocked(items)
	}
	if !next.IsZero() {
		p.armLocked(next)
	}
	p.mu.Unlock()
	if expired > 0 {
		p.signal()
	}
}

// take hands the pool tasks a round leased to its worker: as many as its
// credit and its session's room allow, unless the session stopped claiming
// or its worker drains. It returns the tasks it did not take, which the
// caller abandons: they were never the worker's.
func (p *pool) take(tasks []*flov1.TaskAssignment, now time.Time) (rest []*flov1.TaskAssignment) {
	s := p.s
	if s.claimCtx.Err() != nil || s.workerDraining.Load() {
		return tasks
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := min(len(tasks), p.grants.credit, s.held.room(now))
	if n <= 0 {
		return tasks
	}
	if !p.pushLocked(s.taskBatches(tasks[:n])) {
		return tasks
	}
	// Held before p.mu lets the outbox go to the writer, so the worker may
	// report the tasks as soon as it has them.
	s.held.add(tasks[:n], now)
	p.grants.consume(n)
	return tasks[n:]
}

// pushLocked queues items for the writer, starting the goroutine that moves
// them there; it reports false, queuing nothing, once the session ended.
func (p *pool) pushLocked(items []outgoing) bool {
	if !p.flushing {
		if !p.s.claimers.Go(p.flush) {
			return false
		}
		p.flushing = true
	}
	p.outbox = append(p.outbox, items...)
	return true
}

// flush moves the outbox to the writer until it is empty. Tasks the writer
// can no longer take are abandoned.
func (p *pool) flush() {
	for {
		p.mu.Lock()
		items := p.outbox
		p.outbox = nil
		if len(items) == 0 {
			p.flushing = false
		}
		p.mu.Unlock()
		if len(items) == 0 {
			return
		}
		for _, item := range items {
			if !p.s.enqueue(item) && len(item.tasks) > 0 {
				p.s.abandon(item.tasks)
			}
		}
	}
}

// taskBatches splits claimed tasks into TaskBatches no larger than about
// one maximal payload each, so a worker's receive limit never has to grow
// with its credit.
func (s *session) taskBatches(tasks []*flov1.TaskAssignment) []outgoing {
	limit := s.srv.opts.MaxPayloadBytes + batchOverhead
	var out []outgoing
	flush := func(batch []*flov1.TaskAssignment) {
		msg := &flov1.ServerMessage{Msg: &flov1.ServerMessage_TaskBatch{TaskBatch: &flov1.TaskBatch{Tasks: batch}}}
		out = append(out, outgoing{msg: msg, tasks: batch})
	}
	start, size := 0, 0
	for i, t := range tasks {
		n := t.SizeVT()
		if i > start && size+n > limit {
			flush(tasks[start:i])
			start, size = i, 0
		}
		size += n
	}
	flush(tasks[start:])
	return out
}

func emptyBatch() *flov1.ServerMessage {
	return &flov1.ServerMessage{Msg: &flov1.ServerMessage_TaskBatch{TaskBatch: &flov1.TaskBatch{}}}
}
