package workerstream

import (
	"time"
)

const (
	// maxHeldRecords caps the records a session holds: sent or on their way
	// to its worker and not yet acked or nacked, plus what its outstanding
	// reads may still bring. A read is cut to the room left, so every record
	// a worker gets is tracked, and only tracked records may be settled.
	maxHeldRecords = 16384
	// recordGrace is how long after its message timeout a record the worker
	// never settled still counts as held; by then the group has handed it
	// to someone else.
	recordGrace = time.Minute
)

// heldRecords tracks the records a session handed to its worker and has not
// seen acked or nacked (stream/group/id -> when it stops counting), so a
// shutdown can wait for them as it waits for held tasks, and so the worker
// settles only records it was sent.
type heldRecords struct {
	untilSet
}

func newHeldRecords() *heldRecords {
	return &heldRecords{}
}

func recordKey(stream, group, id string) string { return stream + "/" + group + "/" + id }

func (h *heldRecords) add(d *delivery, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	until := now.Add(d.timeout + recordGrace)
	for _, id := range d.ids {
		h.setLocked(recordKey(d.stream, d.group, id), until)
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
	h.signalIfEmpty()
}

// len returns how many records are held, forgetting those past their time.
func (h *heldRecords) len(now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, until := range h.ids {
		if now.After(until) {
			delete(h.ids, k)
		}
	}
	return len(h.ids)
}
