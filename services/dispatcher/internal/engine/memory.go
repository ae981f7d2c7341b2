package engine

import (
	"errors"
	"time"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// Limits bound what a partition keeps of its tasks in memory. The payload is
// the one part of a task that can be large and that the partition itself
// never needs after the record that brought the task to life: only a claim
// (the worker gets it), a read and a requeue do, and those can read it from
// the view. A queued task needs nothing of the partition until it is
// claimed, so past a count the view holds the tail of a backlog (cold.go).
// Zero values mean no bound.
type Limits struct {
	// PayloadBytes bounds the bytes of payloads held: past it, the payloads
	// of tasks whose last change the view has are let go, the most recently
	// changed first (a queue hands out its oldest tasks first, so the ones
	// kept are the ones claimed next).
	PayloadBytes int64
	// Horizon lets the payload of a queued task due later than this go as
	// soon as the view has it, whatever the bound.
	Horizon time.Duration
	// QueuedTasks bounds the queued tasks held whole; past it the last in
	// hand-out order go cold (cold.go).
	QueuedTasks int
}

// ErrPayloadOut is returned by Requeue when the task's payload was let go:
// its Requeued record must carry it, so Load the task from the view first.
var ErrPayloadOut = errors.New("the task's payload is not in memory: load it from the view first")

// Where an entry's payload is pinned for letting go (entry.pin).
const (
	pinNone = iota
	// pinRecorded: in p.recorded, waiting for the view.
	pinRecorded
	// pinHot: in p.hot, the view has it.
	pinHot
)

// SetLimits sets the partition's payload limits; they apply from the next
// Materialized on.
func (p *Partition) SetLimits(l Limits) { p.limits = l }

// PayloadBytes is how many bytes of payloads the partition holds.
func (p *Partition) PayloadBytes() int64 { return p.payloadBytes }

// pinPayload queues e's payload for letting go once the view has its last
// change (offset e.last).
func (p *Partition) pinPayload(e *entry) {
	if len(e.t.Payload) == 0 || !p.limited() {
		return
	}
	p.unpin(e)
	if e.last < 0 {
		// Read from the view, which has it: it need not wait behind the
		// records for the view to catch up.
		p.viewHas(item{at: e.last, e: e})
		return
	}
	e.pin = pinRecorded
	p.recorded = append(p.recorded, item{at: e.last, e: e})
}

// viewHas takes the payload of the item's entry as the view's: let go at once
// when its task is queued past the horizon, else pinned hot, to go when the
// bound needs the room.
func (p *Partition) viewHas(it item) {
	e := it.e
	if p.limits.Horizon > 0 && e.t.Status == store.Queued && e.t.RunAt.UnixNano() > p.now+p.limits.Horizon.Nanoseconds() {
		p.letGo(e)
		return
	}
	e.pin = pinHot
	p.hotLive++
	p.hot = append(p.hot, it)
}

func (p *Partition) limited() bool { return p.limits.PayloadBytes > 0 || p.limits.Horizon > 0 }

// unpin forgets e's pinned item: e was recorded again, or left.
func (p *Partition) unpin(e *entry) {
	if e.pin == pinHot {
		p.hotLive--
	}
	e.pin = pinNone
}

// pinned says whether it is its entry's current pinned item: the entry was
// not recorded again since, nor let go. (A change not recorded yet keeps the
// payload: the view has it once it has the entry's last record.)
func pinned(it *item, pin uint8) bool {
	return it.e.pin == pin && it.at == it.e.last
}

// letGo drops e's payload from memory: the view has it.
func (p *Partition) letGo(e *entry) {
	p.payloadBytes -= int64(len(e.t.Payload))
	e.t.Payload, e.t.PayloadOut = nil, true
	e.pin = pinNone
}

// shed lets payloads the view holds (changes up to offset) go: those of
// queued tasks due beyond the horizon, then, newest first, as many as it
// takes to bring the held bytes within the bound.
func (p *Partition) shed(offset int64) {
	if !p.limited() {
		return
	}
	n := 0
	for ; n < len(p.recorded) && p.recorded[n].at <= offset; n++ {
		if it := &p.recorded[n]; pinned(it, pinRecorded) {
			p.viewHas(*it)
		}
	}
	if n > 0 {
		// The rest moves to the front instead of being sliced off it: a
		// slice that gives up its front has appends copy it into new
		// arrays over and over.
		kept := copy(p.recorded, p.recorded[n:])
		clear(p.recorded[kept:])
		p.recorded = shrunk(p.recorded[:kept])
	}
	for p.limits.PayloadBytes > 0 && p.payloadBytes > p.limits.PayloadBytes && len(p.hot) > 0 {
		it := p.hot[len(p.hot)-1]
		p.hot[len(p.hot)-1] = item{}
		p.hot = p.hot[:len(p.hot)-1]
		if pinned(&it, pinHot) {
			p.hotLive--
			p.letGo(it.e)
		}
	}
	p.compactHot()
}

// compactHot drops the items of payloads no longer pinned hot once they are
// most of p.hot: each keeps its entry reachable.
func (p *Partition) compactHot() {
	if len(p.hot) > 64 && len(p.hot) > 2*p.hotLive {
		kept := p.hot[:0]
		for _, it := range p.hot {
			if pinned(&it, pinHot) {
				kept = append(kept, it)
			}
		}
		clear(p.hot[len(kept):])
		p.hot = shrunk(kept)
	}
}
