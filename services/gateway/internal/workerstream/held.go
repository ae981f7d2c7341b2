package workerstream

import (
	"sync"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// leaseGrace is how long after its lease ended a task the worker never
// reported is still counted as held; after that it has surely been requeued
// and stops taking room.
const leaseGrace = time.Minute

// held tracks the tasks a session handed to its worker and has not seen
// reported. It bounds what one stream can hold and tells a draining session
// when its worker is done.
type held struct {
	max int

	mu    sync.Mutex
	tasks map[string]time.Time // task id -> lease end

	// empty receives a signal whenever the set becomes empty.
	empty chan struct{}
}

func newHeld(max int) *held {
	return &held{max: max, tasks: make(map[string]time.Time), empty: make(chan struct{}, 1)}
}

func (h *held) add(tasks []*flov1.TaskAssignment, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range tasks {
		until := now.Add(time.Hour)
		if t.GetLeaseUntil() != nil {
			until = t.GetLeaseUntil().AsTime()
		}
		h.tasks[t.GetTaskId()] = until
	}
}

// remove forgets tasks and reports whether the set was full before, so the
// caller can wake claim loops waiting for room.
func (h *held) remove(ids []string) (wasFull bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	wasFull = len(h.tasks) >= h.max
	for _, id := range ids {
		delete(h.tasks, id)
	}
	if len(h.tasks) == 0 {
		select {
		case h.empty <- struct{}{}:
		default:
		}
	}
	return wasFull
}

// extend records a lease extended by a touch.
func (h *held) extend(id string, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.tasks[id]; ok {
		h.tasks[id] = until
	}
}

// room returns how many more tasks the session may hand out. When full it
// first drops tasks whose lease ended long ago, which a worker that never
// reported would otherwise pin forever.
func (h *held) room(now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.tasks) >= h.max {
		for id, until := range h.tasks {
			if now.After(until.Add(leaseGrace)) {
				delete(h.tasks, id)
			}
		}
	}
	return h.max - len(h.tasks)
}

func (h *held) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.tasks)
}
