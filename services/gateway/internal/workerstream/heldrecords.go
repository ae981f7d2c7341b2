package workerstream

import (
	"sync"
	"time"
)

const (
	// maxHeldRecords caps the records a session tracks as held. Past it,
	// further records are not tracked: the set only makes a shutdown wait
	// for acks, which then may end sooner.
	maxHeldRecords = 16384
	// recordGrace is how long after its message timeout a record the worker
	// never settled still counts as held; by then the group has handed it
	// to someone else.
	recordGrace = time.Minute
)

// heldRecords tracks the records a session sent its worker and has not seen
// acked or nacked, so a shutdown can wait for them as it waits for held
// tasks.
type heldRecords struct {
	max int

	mu  sync.Mutex
	ids map[string]time.Time // stream/group/id -> when it stops counting

	// empty receives a signal whenever the set becomes empty.
	empty chan struct{}
}

func newHeldRecords(max int) *heldRecords {
	return &heldRecords{max: max, ids: make(map[string]time.Time), empty: make(chan struct{}, 1)}
}

func recordKey(stream, group, id string) string { return stream + "/" + group + "/" + id }

func (h *heldRecords) add(d *delivery, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ids)+len(d.ids) > h.max {
		h.sweep(now)
	}
	until := now.Add(d.timeout + recordGrace)
	for _, id := range d.ids {
		if len(h.ids) >= h.max {
			return
		}
		h.ids[recordKey(d.stream, d.group, id)] = until
	}
}

func (h *heldRecords) remove(stream, group string, ids []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ids) == 0 {
		return
	}
	for _, id := range ids {
		delete(h.ids, recordKey(stream, group, id))
	}
	if len(h.ids) == 0 {
		h.signalEmpty()
	}
}

// len returns how many records are held, forgetting those past their time.
func (h *heldRecords) len(now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep(now)
	return len(h.ids)
}

func (h *heldRecords) sweep(now time.Time) {
	for k, until := range h.ids {
		if now.After(until) {
			delete(h.ids, k)
		}
	}
}

func (h *heldRecords) signalEmpty() {
	select {
	case h.empty <- struct{}{}:
	default:
	}
}
