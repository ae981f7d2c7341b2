// Package wake tells waiting requests (task claims, group reads) that work may
// have arrived, so none polls the database in a loop. Wake-ups come from this
// replica's own commits, from Postgres NOTIFY (other replicas), from timers set
// for work that becomes ready in the future, and from a slow safety tick that
// catches anything missed.
package wake

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// maxTimers bounds the scheduled wake-ups held in memory; beyond it new ones
// are dropped and the safety tick picks that work up.
const maxTimers = 100_000

// Hub routes wake-ups to waiters by key (a queue, a stream, a group).
type Hub struct {
	mu      sync.Mutex
	waiters map[string]map[*Waiter]struct{}
	timers  timerHeap
	rearm   chan struct{}
	// probes counts Probe calls; a waiter's probedAt is the count when it
	// subscribed or was last probed, so Probe takes turns.
	probes uint64
	// gens holds, for each key with waiters, the value seq had when the
	// key was last woken or got its first waiter (see Stamp).
	gens map[string]uint64
	seq  uint64
	// count is how many waiters are subscribed.
	count int
}

// Waiter is one waiting request. Its channel holds at most one pending
// signal, so a wake-up that arrives while the request is busy is not lost.
type Waiter struct {
	keys     []string
	c        chan struct{}
	probedAt uint64 // guarded by the hub's mu
	gone     bool   // unsubscribed; guarded by the hub's mu
	probed   atomic.Bool
}

// C is signalled when any of the waiter's keys may have work.
func (w *Waiter) C() <-chan struct{} { return w.c }

// Probed reports whether a Probe signalled the waiter since the last call,
// and clears that. A waiter that finds work after a probe should Wake the
// others of its keys: the probe stood in for a wake-up they all missed.
func (w *Waiter) Probed() bool { return w.probed.Swap(false) }

func (w *Waiter) signal() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// NewHub returns an empty Hub.
func NewHub() *Hub {
	return &Hub{waiters: map[string]map[*Waiter]struct{}{}, gens: map[string]uint64{}, rearm: make(chan struct{}, 1)}
}

// Subscribe registers a waiter for keys. Subscribe before looking for work:
// whatever is woken between the look and the wait is then still signalled.
func (h *Hub) Subscribe(keys []string) *Waiter {
	w := &Waiter{keys: keys, c: make(chan struct{}, 1)}
	h.mu.Lock()
	// It is about to look for work, as good as probed.
	w.probedAt = h.probes
	h.count++
	for _, k := range keys {
		set := h.waiters[k]
		if set == nil {
			set = map[*Waiter]struct{}{}
			h.waiters[k] = set
			h.seq++
			h.gens[k] = h.seq
		}
		set[w] = struct{}{}
	}
	h.mu.Unlock()
	return w
}

// Unsubscribe removes a waiter.
func (h *Hub) Unsubscribe(w *Waiter) {
	h.mu.Lock()
	if !w.gone {
		w.gone = true
		h.count--
	}
	for _, k := range w.keys {
		if set := h.waiters[k]; set != nil {
			delete(set, w)
			if len(set) == 0 {
				delete(h.waiters, k)
				delete(h.gens, k)
			}
		}
	}
	h.mu.Unlock()
}

// Wake signals every waiter of the given keys.
func (h *Hub) Wake(keys ...string) {
	h.mu.Lock()
	for _, k := range keys {
		set := h.waiters[k]
		if set == nil {
			continue
		}
		h.seq++
		h.gens[k] = h.seq
		for w := range set {
			w.signal()
		}
	}
	h.mu.Unlock()
}

// WakeAll signals every waiter.
func (h *Hub) WakeAll() {
	h.mu.Lock()
	h.seq++
	for k, set := range h.waiters {
		h.gens[k] = h.seq
		for w := range set {
			w.signal()
		}
	}
	h.mu.Unlock()
}

// Stamp returns a value that changes whenever one of keys is woken (by
// Wake, WakeAll or a timer, not by Probe) or has no waiters at some point.
// A subscriber that found no work may remember the stamp taken before it
// looked: while Stamp still returns it, looking again would find the same,
// as far as this hub was told. It is 0, matching nothing, for a key
// without waiters.
func (h *Hub) Stamp(keys ...string) uint64 {
	var stamp uint64
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		g, ok := h.gens[k]
		if !ok {
			return 0
		}
		stamp = max(stamp, g)
	}
	return stamp
}

// Probe signals, for each key, the one of its waiters probed longest ago,
// unless one of them was already probed by this call for another of its
// keys. It is the cheap safety check for many waiters of a key that would
// all find the same work: one looks, and if it finds work it wakes the
// others (see Waiter.Probed), so a missed wake-up costs each key at most one
// look per probe instead of one per waiter.
func (h *Hub) Probe() {
	h.mu.Lock()
	h.probes++
	for _, set := range h.waiters {
		var pick *Waiter
		for w := range set {
			if w.probedAt == h.probes {
				pick = nil // covered
				break
			}
			if pick == nil || w.probedAt < pick.probedAt {
				pick = w
			}
		}
		if pick != nil {
			pick.probedAt = h.probes
			pick.probed.Store(true)
			pick.signal()
		}
	}
	h.mu.Unlock()
}

// Waiters is how many waiters are subscribed.
func (h *Hub) Waiters() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count
}

// Probes is how many times Probe ran.
func (h *Hub) Probes() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.probes
}

// WakeAt schedules a wake-up of key at t, for work that becomes ready then.
func (h *Hub) WakeAt(key string, t time.Time) {
	h.mu.Lock()
	if len(h.timers) >= maxTimers {
		h.mu.Unlock()
		return
	}
	heap.Push(&h.timers, timer{at: t, key: key})
	earliest := h.timers[0].key == key && h.timers[0].at.Equal(t)
	h.mu.Unlock()
	if earliest {
		select {
		case h.rearm <- struct{}{}:
		default:
		}
	}
}

// Run fires scheduled wake-ups and the safety tick, which wakes every
// waiter, until ctx ends.
func (h *Hub) Run(ctx context.Context, safetyTick time.Duration) error {
	return h.run(ctx, safetyTick, h.WakeAll)
}

// RunProbing is Run with a safety tick that probes (see Probe) instead of
// waking every waiter, for waiters that wake the others of their keys when
// a probe finds them work.
func (h *Hub) RunProbing(ctx context.Context, safetyTick time.Duration) error {
	return h.run(ctx, safetyTick, h.Probe)
}

func (h *Hub) run(ctx context.Context, safetyTick time.Duration, onTick func()) error {
	tick := time.NewTicker(safetyTick)
	defer tick.Stop()
	next := time.NewTimer(time.Hour)
	defer next.Stop()
	for {
		next.Reset(h.fireDue(time.Now()))
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			onTick()
		case <-next.C:
		case <-h.rearm:
		}
	}
}

// fireDue wakes the keys of every timer due at now and returns how long until
// the next one.
func (h *Hub) fireDue(now time.Time) time.Duration {
	var due []string
	h.mu.Lock()
	for len(h.timers) > 0 && !h.timers[0].at.After(now) {
		due = append(due, heap.Pop(&h.timers).(timer).key)
	}
	wait := time.Hour
	if len(h.timers) > 0 {
		wait = h.timers[0].at.Sub(now)
	}
	h.mu.Unlock()
	h.Wake(due...)
	return wait
}

type timer struct {
	at  time.Time
	key string
}

type timerHeap []timer

func (t timerHeap) Len() int           { return len(t) }
func (t timerHeap) Less(i, j int) bool { return t[i].at.Before(t[j].at) }
func (t timerHeap) Swap(i, j int)      { t[i], t[j] = t[j], t[i] }
func (t *timerHeap) Push(x any)        { *t = append(*t, x.(timer)) }
func (t *timerHeap) Pop() any {
	old := *t
	x := old[len(old)-1]
	*t = old[:len(old)-1]
	return x
}
