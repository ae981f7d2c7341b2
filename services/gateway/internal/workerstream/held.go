package workerstream

import (
	"strconv"
	"sync"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// leaseGrace is how long after its lease ended a task the worker never
// reported is still counted as held; after that it has surely been requeued
// and stops taking room.
const leaseGrace = time.Minute

// untilSet is a set of ids, each with the time it stops counting, that
// signals when it becomes empty. A session's held tasks and held records are
// each one; what a session holds is also what its worker may report. Its
// zero value is an empty set that has allocated nothing, as an idle
// session's sets stay.
type untilSet struct {
	mu sync.Mutex
	// ids is nil until an id is added, and again after takeAll.
	ids map[string]time.Time
	// earliest is at or before the earliest time in ids (zero: none known),
	// so a sweep for ended times is skipped until then.
	earliest time.Time

	// empty, once made by emptied, receives a signal whenever the set
	// becomes empty.
	empty chan struct{}
}

// emptied returns the channel that receives a signal whenever the set
// becomes empty from then on; a waiter asks for it before it looks at the
// set's size.
func (u *untilSet) emptied() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.empty == nil {
		u.empty = make(chan struct{}, 1)
	}
	return u.empty
}

func (u *untilSet) setLocked(id string, until time.Time) {
	if u.ids == nil {
		u.ids = make(map[string]time.Time)
	}
	u.ids[id] = until
	if u.earliest.IsZero() || until.Before(u.earliest) {
		u.earliest = until
	}
}

// has says whether id is in the set.
func (u *untilSet) has(id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.ids[id]
	return ok
}

// take removes id and returns its time, for another session of the same
// worker to adopt.
func (u *untilSet) take(id string) (time.Time, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	until, ok := u.ids[id]
	if ok {
		delete(u.ids, id)
		u.signalIfEmpty()
	}
	return until, ok
}

// put adds id, adopted from another session; it may go over a bound the
// set's owner keeps, since the task or record was already counted there.
func (u *untilSet) put(id string, until time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.setLocked(id, until)
}

// takeAll empties the set and returns what it held.
func (u *untilSet) takeAll() map[string]time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	all := u.ids
	u.ids, u.earliest = nil, time.Time{}
	return all
}

func (u *untilSet) signalIfEmpty() {
	if len(u.ids) > 0 || u.empty == nil {
		return
	}
	select {
	case u.empty <- struct{}{}:
	default:
	}
}

// held tracks the task attempts a session handed to its worker and has not
// seen reported (attemptKey -> lease end). Attempts, not tasks: a task
// nacked or failed for a retry may come back to the same stream as its next
// attempt before the report of the last one has returned, and forgetting
// that report must not forget the new attempt. It bounds what one stream can hold, tells
// a draining session when its worker is done, and says which tasks the
// worker may report, touch, nack or abandon.
type held struct {
	untilSet
	max int
}

func newHeld(max int) *held {
	return &held{max: max}
}

func (h *held) add(tasks []*flov1.TaskAssignment, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range tasks {
		until := now.Add(time.Hour)
		if t.GetLeaseUntil() != nil {
			until = t.GetLeaseUntil().AsTime()
		}
		h.setLocked(attemptKey(t.GetTaskId(), t.GetAttempt()), until)
	}
}

// attemptKey names one attempt of a task in the held set.
func attemptKey(taskID string, attempt int32) string {
	return taskID + "/" + strconv.Itoa(int(attempt))
}

// remove forgets task attempts (attemptKeys) and reports whether the set was full before, so the
// caller can tell the pools' hubs there is room.
func (h *held) remove(ids []string) (wasFull bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	wasFull = len(h.ids) >= h.max
	for _, id := range ids {
		delete(h.ids, id)
	}
	h.signalIfEmpty()
	return wasFull
}

// extend records a lease extended by a touch of the attempt key.
func (h *held) extend(key string, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.ids[key]; ok {
		h.ids[key] = until
	}
}

// room returns how many more tasks the session may hand out. When full it
// first drops tasks whose lease ended long ago, which a worker that never
// reported would otherwise pin forever; it looks through them only once the
// earliest lease can have ended so long ago, since a busy stream is full
// at every claim.
func (h *held) room(now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ids) >= h.max && now.After(h.earliest.Add(leaseGrace)) {
		h.earliest = time.Time{}
		for id, until := range h.ids {
			switch {
			case now.After(until.Add(leaseGrace)):
				delete(h.ids, id)
			case h.earliest.IsZero() || until.Before(h.earliest):
				h.earliest = until
			}
		}
	}
	return h.max - len(h.ids)
}

func (h *held) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ids)
}
