package owner

import (
	"context"
	"iter"
	"slices"
	"sync"
	"time"

	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// standing is a claim that found nothing and waits at every partition of
// this replica. A partition whose batch makes tasks of its queues ready
// leases them to it in that batch, so a task invoked while a worker waits
// is created and handed out in one transaction. Partitions reserve the
// claim's slots (the next ones in turn) for what they lease and give back
// those they did not fill, so together they never give it more than it
// asked for and a burst still spreads over its workers.
type standing struct {
	ns      string
	actions []string
	signal  chan struct{}

	mu sync.Mutex
	// free are the slots no partition holds, in the order they are given.
	free    []engine.Slot
	closed  bool
	pending int
	got     []engine.Claimed
}

func newStanding(ns string, actions []string, slots []engine.Slot) *standing {
	return &standing{ns: ns, actions: actions, free: slots, signal: make(chan struct{}, 1)}
}

// reserve takes up to n of the claim's free slots for a partition, which
// owes a deliver call when it took any.
func (s *standing) reserve(n int) []engine.Slot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.free) == 0 {
		return nil
	}
	k := min(n, len(s.free))
	slots := s.free[:k:k]
	s.free = s.free[k:]
	s.pending++
	return slots
}

// deliver hands over what a partition leased against its reservation, once
// its transaction is over; got is empty when it failed. The engine fills a
// claim's slots from the first, so the unfilled ones are the reservation's
// tail: they go back to the front, to be the next given.
//
// Once a delivery brings tasks the claim takes no more reservations, so it
// answers as soon as the partitions already holding some deliver. Taking
// more would keep it waiting while tasks trickle into one partition after
// another, each with its own transaction: at half load that held handed-out
// tasks back for 4 ms at the median and 36 ms at the 99th percentile. Tasks
// that come later go to the next claim, which the gateway sends as soon as
// this one answers.
func (s *standing) deliver(reserved []engine.Slot, got []engine.Claimed) {
	s.mu.Lock()
	s.pending--
	if unused := reserved[len(got):]; len(unused) > 0 {
		s.free = append(slices.Clip(unused), s.free...)
	}
	s.got = append(s.got, got...)
	if len(s.got) > 0 {
		s.closed = true
	}
	s.mu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// finishIfServed closes the claim and returns its tasks when it has some
// and no partition still owes a delivery.
func (s *standing) finishIfServed() ([]engine.Claimed, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.got) == 0 || s.pending > 0 {
		return nil, false
	}
	s.closed = true
	return s.got, true
}

// close stops further reservations and waits, up to stopWait, for the
// deliveries partitions still owe; it returns everything delivered.
func (s *standing) close() []engine.Claimed {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	deadline := time.NewTimer(stopWait)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		pending, got := s.pending, s.got
		s.mu.Unlock()
		if pending == 0 {
			return got
		}
		select {
		case <-s.signal:
		case <-deadline.C:
			return got
		}
	}
}

// standingClaims indexes the waiting claims of a replica by queue.
type standingClaims struct {
	mu     sync.RWMutex
	byKey  map[string]map[*standing]struct{}
	claims int
}

func (sc *standingClaims) park(s *standing) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.byKey == nil {
		sc.byKey = map[string]map[*standing]struct{}{}
	}
	for _, a := range s.actions {
		k := store.Key(s.ns, a)
		if sc.byKey[k] == nil {
			sc.byKey[k] = map[*standing]struct{}{}
		}
		sc.byKey[k][s] = struct{}{}
	}
	sc.claims++
}

func (sc *standingClaims) unpark(s *standing) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, a := range s.actions {
		k := store.Key(s.ns, a)
		delete(sc.byKey[k], s)
		if len(sc.byKey[k]) == 0 {
			delete(sc.byKey, k)
		}
	}
	sc.claims--
}

// waitingFor returns the claims waiting for any of keys, each once.
func (sc *standingClaims) waitingFor(keys iter.Seq[string]) []*standing {
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	if sc.claims == 0 {
		return nil
	}
	var out []*standing
	seen := map[*standing]bool{}
	for k := range keys {
		for s := range sc.byKey[k] {
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out
}

// park makes s wait at every partition, counted in flo.dispatcher.claims.waiting.
func (r *Replica) park(s *standing) {
	r.standing.park(s)
	r.metrics.waiting.Add(context.Background(), 1)
}

// unpark ends s's wait.
func (r *Replica) unpark(s *standing) {
	r.standing.unpark(s)
	r.metrics.waiting.Add(context.Background(), -1)
}

// lease is what a partition leased to a standing claim in one batch.
type lease struct {
	s        *standing
	reserved []engine.Slot
	got      []engine.Claimed
}

// serveStanding leases ready tasks of this partition to the claims waiting
// for them, within the batch being built, and returns the changes and
// what to deliver once the batch's transaction is over. The claims are
// found by the queues with tasks claimable now, which the engine knows
// from the batch's own changes: a queue the partition learns of only after
// the batch (p.keys) would leave the first task of a new queue waiting for
// the next batch, two seconds when idle.
func (p *partition) serveStanding(now time.Time) ([]engine.Change, []lease) {
	// Listed only when some claim waits.
	waiting := p.r.standing.waitingFor(func(yield func(string) bool) {
		for _, k := range p.eng.Actions(now) {
			if !yield(k) {
				return
			}
		}
	})
	var (
		changes []engine.Change
		leases  []lease
	)
	for _, s := range waiting {
		ready := 0
		for _, a := range s.actions {
			ready += p.eng.Ready(s.ns, a, now)
		}
		if ready == 0 {
			continue
		}
		slots := s.reserve(ready)
		if len(slots) == 0 {
			continue
		}
		got, ch := p.eng.Claim(s.ns, s.actions, slots, now)
		changes = append(changes, ch...)
		leases = append(leases, lease{s: s, reserved: slots, got: got})
	}
	return changes, leases
}

// poke makes the partition run a batch soon, in which it serves the
// standing claims; a partition whose queue is full is about to run one.
func (p *partition) poke() {
	select {
	case p.ops <- pokeOp{}:
	default:
	}
}

// pokeOp changes nothing; it only makes a batch happen.
type pokeOp struct{}

func (pokeOp) apply(_ *partition, _ time.Time, changes []engine.Change) []engine.Change {
	return changes
}
func (pokeOp) done(error) {}
