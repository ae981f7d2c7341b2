package workerstream

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	backoffretry "github.com/razorbill/flo/libs/retry"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// grant is the credit one Ready gave: up to remaining tasks until deadline.
type grant struct {
	remaining int
	deadline  time.Time
}

// pool is the credit for one combination of actions and lease length. Grants
// are used oldest first; a grant whose deadline passes with credit left is
// dropped and answered with one empty TaskBatch, which tells the worker to
// send that Ready again. A worker can mirror this bookkeeping exactly because
// it sees the same messages in the same order.
type pool struct {
	actions []string
	leaseMS int64
	wake    chan struct{}

	mu     sync.Mutex
	grants []grant
	credit int
}

func newPool(actions []string, leaseMS int64) *pool {
	return &pool{actions: actions, leaseMS: leaseMS, wake: make(chan struct{}, 1)}
}

// poolKey names a pool: its lease length and its sorted action names.
func poolKey(actions []string, leaseMS int64) string {
	return strconv.FormatInt(leaseMS, 10) + "\x00" + strings.Join(actions, "\x00")
}

func (p *pool) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// add records a Ready's credit, clamped so the pool never holds more than
// maxCredit.
func (p *pool) add(count int, deadline time.Time) {
	p.mu.Lock()
	count = min(count, maxCredit-p.credit)
	if count > 0 {
		p.grants = append(p.grants, grant{remaining: count, deadline: deadline})
		p.credit += count
	}
	p.mu.Unlock()
	p.signal()
}

// expire drops the grants whose deadline passed. It returns how many it
// dropped, the credit left and the earliest deadline among the grants left.
func (p *pool) expire(now time.Time) (expired, credit int, next time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.grants[:0]
	for _, g := range p.grants {
		if !now.Before(g.deadline) {
			expired++
			p.credit -= g.remaining
			continue
		}
		if next.IsZero() || g.deadline.Before(next) {
			next = g.deadline
		}
		kept = append(kept, g)
	}
	clear(p.grants[len(kept):])
	p.grants = kept
	return expired, p.credit, next
}

// clear drops every grant, for a worker that gets nothing more.
func (p *pool) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.grants, p.credit = nil, 0
}

// consume uses n credit, oldest grants first.
func (p *pool) consume(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.credit -= n
	i := 0
	for ; i < len(p.grants) && n > 0; i++ {
		use := min(n, p.grants[i].remaining)
		p.grants[i].remaining -= use
		n -= use
		if p.grants[i].remaining > 0 {
			break
		}
	}
	p.grants = slices.Delete(p.grants, 0, i)
	if p.credit < 0 {
		p.credit = 0
	}
}

// claimLoop turns one pool's credit into claimed tasks until the session
// stops claiming or the worker drains. A dispatcher that is down or
// restarting is retried with backoff; the worker's stream stays open
// meanwhile.
func (s *session) claimLoop(p *pool) {
	b := dispatcherRetry.Backoff()
	for {
		count, wait, ok := s.awaitCredit(p)
		if !ok {
			return
		}
		tasks, err := s.claim(p, count, wait)
		if err != nil {
			if s.claimCtx.Err() != nil {
				return
			}
			if permanent(err) {
				s.fail(err)
				return
			}
			s.log.WarnContext(s.ctx, "claim tasks failed; retrying", slog.Any("error", err))
			if !backoffretry.Sleep(s.claimCtx, b.NextBackOff()) {
				return
			}
			continue
		}
		b.Reset()
		if len(tasks) == 0 {
			continue
		}
		if s.workerDraining.Load() {
			// The claim was in flight when the drain began: give its tasks
			// back rather than hand them to a worker told it gets no more.
			s.abandon(tasks)
			return
		}
		p.consume(len(tasks))
		s.held.add(tasks, time.Now())
		s.sendTasks(tasks)
	}
}

// awaitCredit waits until the pool has credit and the session has room,
// answering expired grants with empty batches meanwhile. It returns how many
// tasks to claim and how long the claim may wait: until the earliest grant
// expires, at most maxClaimWait. The room is what the stream may still hold
// (its worker's max_concurrency, or maxHeld), so credit beyond it waits for
// tasks to be reported. It reports false once the session stops claiming or
// the worker drains.
func (s *session) awaitCredit(p *pool) (count int, wait time.Duration, ok bool) {
	for {
		if s.workerDraining.Load() {
			return 0, 0, false
		}
		now := time.Now()
		expired, credit, next := p.expire(now)
		for range expired {
			if !s.enqueue(outgoing{msg: emptyBatch()}) {
				return 0, 0, false
			}
		}
		room := s.held.room(now)
		if credit > 0 && room > 0 {
			return min(credit, room, maxClaim), min(next.Sub(now), maxClaimWait), true
		}
		if !s.idle(p, credit > 0, next.Sub(now)) {
			return 0, 0, false
		}
	}
}

// idle waits for the pool to be woken (new credit, room freed) or, when it
// has credit, for its earliest grant to expire. It reports false once the
// session stops claiming.
func (s *session) idle(p *pool, hasCredit bool, untilExpiry time.Duration) bool {
	var timeout <-chan time.Time
	if hasCredit {
		t := time.NewTimer(untilExpiry)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-p.wake:
		return true
	case <-timeout:
		return true
	case <-s.claimCtx.Done():
		return false
	}
}

func (s *session) claim(p *pool, count int, wait time.Duration) ([]*flov1.TaskAssignment, error) {
	ctx, cancel := context.WithTimeout(s.claimCtx, wait+claimSlack)
	defer cancel()
	return s.srv.opts.Claimer.Claim(ctx, &dispatcherv1.ClaimRequest{
		Namespace: s.namespace,
		Slots:     []*dispatcherv1.ClaimSlot{{WorkerId: s.workerID, Count: int32(count)}},
		Actions:   p.actions,
		WaitMs:    max(wait.Milliseconds(), 1),
		LeaseMs:   p.leaseMS,
	}, s.abandon)
}

// sendTasks queues claimed tasks as TaskBatches no larger than about one
// maximal payload each, so a worker's receive limit never has to grow with
// its credit. Tasks that can no longer be sent are abandoned at once rather
// than left leased to a worker that will never see them.
func (s *session) sendTasks(tasks []*flov1.TaskAssignment) {
	limit := s.srv.opts.MaxPayloadBytes + batchOverhead
	flush := func(batch []*flov1.TaskAssignment) {
		msg := &flov1.ServerMessage{Msg: &flov1.ServerMessage_TaskBatch{TaskBatch: &flov1.TaskBatch{Tasks: batch}}}
		if !s.enqueue(outgoing{msg: msg, tasks: batch}) {
			s.abandon(batch)
		}
	}
	start, size := 0, 0
	for i, t := range tasks {
		n := proto.Size(t)
		if i > start && size+n > limit {
			flush(tasks[start:i])
			start, size = i, 0
		}
		size += n
	}
	flush(tasks[start:])
}

func emptyBatch() *flov1.ServerMessage {
	return &flov1.ServerMessage{Msg: &flov1.ServerMessage_TaskBatch{TaskBatch: &flov1.TaskBatch{}}}
}
