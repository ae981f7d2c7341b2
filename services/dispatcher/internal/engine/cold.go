package engine

import (
	"bytes"
	"cmp"
	stdheap "container/heap"
	"maps"
	"slices"

	"github.com/google/uuid"
)

// A partition holds every queued task whole up to Limits.QueuedTasks. Past
// it, the queued tasks last in hand-out order go cold: the view has them
// whole, and the partition keeps only their ids and places in the queue,
// about 170 bytes against 1,150. Cold tasks are not claimed; when the
// partition holds half the bound or less, the owner reads the next ones in
// hand-out order back from the view (Warm, Warmed). A cold task changes only
// once it is held again, so the view's row is the whole of it meanwhile.

// coldTask is a cold task's id and place in the queue.
type coldTask struct {
	id      uuid.UUID
	prio    int32
	runAt   int64
	created int64
}

// coldHeap orders cold tasks: coldReady in hand-out order, coldDelayed by
// due time. Items of tasks no longer cold (p.cold) are skipped as they
// surface.
type coldHeap struct {
	items []coldTask
	less  func(a, b *coldTask) bool
}

func (h *coldHeap) Len() int           { return len(h.items) }
func (h *coldHeap) Less(i, j int) bool { return h.less(&h.items[i], &h.items[j]) }
func (h *coldHeap) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *coldHeap) Push(x any)         { h.items = append(h.items, x.(coldTask)) }
func (h *coldHeap) Pop() any {
	n := len(h.items) - 1
	it := h.items[n]
	h.items = h.items[:n]
	return it
}

func coldHandOut(a, b *coldTask) bool {
	return cmp.Or(cmp.Compare(b.prio, a.prio), cmp.Compare(a.runAt, b.runAt), cmp.Compare(a.created, b.created),
		bytes.Compare(a.id[:], b.id[:])) < 0
}

func coldDue(a, b *coldTask) bool {
	return cmp.Or(cmp.Compare(a.runAt, b.runAt), bytes.Compare(a.id[:], b.id[:])) < 0
}

// Cold is how many queued tasks the partition holds only in the view.
func (p *Partition) Cold() int { return len(p.cold) }

// Queued is how many queued tasks the partition holds whole: those its
// ready and delayed indexes hold.
func (p *Partition) Queued() int {
	n := p.delayed.live
	for _, h := range p.ready {
		n += h.live
	}
	return n
}

// LoadCold puts a queued task read from the view into the partition as cold
// (a rebuild past the bound): only its id and place are kept.
func (p *Partition) LoadCold(t Task) {
	if p.Has(t.ID) {
		return
	}
	p.see(t.UpdatedAt)
	p.addCold(t)
}

func (p *Partition) addCold(t Task) {
	c := coldTask{id: t.ID, prio: t.Priority, runAt: t.RunAt.UnixNano(), created: t.CreatedAt.UnixNano()}
	p.cold[t.ID] = false
	if c.runAt <= p.now {
		stdheap.Push(&p.coldReady, c)
	} else {
		stdheap.Push(&p.coldDelayed, c)
	}
}

// unchill makes a cold task an ordinary one to be held again (loaded, or
// replayed from the log); it reports whether it was cold.
func (p *Partition) unchill(id uuid.UUID) bool {
	if _, ok := p.cold[id]; !ok {
		return false
	}
	delete(p.cold, id)
	return true
}

// chill lets the queued tasks last in hand-out order go cold, once the
// partition holds more than the bound by a tenth, down to nine tenths of it:
// delayed ones first, the latest due first, then ready ones from the end of
// their queues. Only tasks whose state the view has (changes up to offset)
// go.
func (p *Partition) chill(offset int64) {
	bound := p.limits.QueuedTasks
	if bound <= 0 || offset == p.chilledAt {
		return
	}
	queued := p.Queued()
	if queued <= bound+bound/10 {
		return
	}
	// Until the view moves on, another look finds no more to let go (a
	// view stalled with Postgres away would otherwise have every batch
	// look over every queued task).
	p.chilledAt = offset
	type candidate struct {
		ready bool
		e     *entry
	}
	var cands []candidate
	add := func(h *heap, ready bool) {
		for i := range h.items {
			if it := &h.items[i]; it.live() && it.e.last <= offset {
				cands = append(cands, candidate{ready: ready, e: it.e})
			}
		}
	}
	add(&p.delayed, false)
	for _, h := range p.ready {
		add(h, true)
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		if a.ready != b.ready {
			if a.ready {
				return 1
			}
			return -1
		}
		x, y := &a.e.t, &b.e.t
		if !a.ready {
			return cmp.Or(y.RunAt.Compare(x.RunAt), bytes.Compare(y.ID[:], x.ID[:]))
		}
		return cmp.Or(cmp.Compare(x.Priority, y.Priority), y.RunAt.Compare(x.RunAt), y.CreatedAt.Compare(x.CreatedAt),
			bytes.Compare(y.ID[:], x.ID[:]))
	})
	n := min(queued-(bound-bound/10), len(cands))
	for _, c := range cands[:n] {
		e := c.e
		e.in.stale(e.t.Priority)
		e.in = nil
		e.gen++
		p.unpin(e)
		p.payloadBytes -= int64(len(e.t.Payload))
		delete(p.tasks, e.t.ID)
		p.addCold(e.t)
	}
	// The entries let go are reachable from their stale index items, and a
	// map never gives back its room: without these the memory would stay.
	for _, h := range p.ready {
		h.compact()
		h.shrink()
	}
	p.delayed.compact()
	p.delayed.shrink()
	if n > len(p.tasks) {
		tasks := make(map[uuid.UUID]*entry, len(p.tasks))
		maps.Copy(tasks, p.tasks)
		p.tasks = tasks
	}
}

// warmCold moves cold delayed tasks due by now to the cold ready ones.
func (p *Partition) warmCold() {
	for p.coldDelayed.Len() > 0 && p.coldDelayed.items[0].runAt <= p.now {
		c := stdheap.Pop(&p.coldDelayed).(coldTask)
		if loading, ok := p.cold[c.id]; ok && !loading {
			stdheap.Push(&p.coldReady, c)
		}
	}
}

// Warming is a read of cold tasks back from the view under way.
type Warming struct{ tasks []coldTask }

// Len is how many tasks to read.
func (w *Warming) Len() int { return len(w.tasks) }

// IDs are the tasks to read.
func (w *Warming) IDs() []uuid.UUID {
	out := make([]uuid.UUID, len(w.tasks))
	for i, c := range w.tasks {
		out[i] = c.id
	}
	return out
}

// Warm picks the cold tasks to read back from the view, the next in
// hand-out order (then the delayed ones soonest due), as many as bring the
// partition back to nine tenths of its bound; nil while the partition holds
// more than half the bound or has no cold task. They stay cold (Has) until
// Warmed or Unwarm.
func (p *Partition) Warm() *Warming {
	bound := p.limits.QueuedTasks
	if bound <= 0 || len(p.cold) == 0 {
		return nil
	}
	queued := p.Queued()
	if queued > bound/2 {
		return nil
	}
	p.warmCold()
	n := bound - bound/10 - queued
	w := &Warming{}
	for _, h := range []*coldHeap{&p.coldReady, &p.coldDelayed} {
		for len(w.tasks) < n && h.Len() > 0 {
			c := stdheap.Pop(h).(coldTask)
			if loading, ok := p.cold[c.id]; ok && !loading {
				p.cold[c.id] = true
				w.tasks = append(w.tasks, c)
			}
		}
	}
	if len(w.tasks) == 0 {
		return nil
	}
	return w
}

// Warmed holds the tasks of w again, as the view had them (tasks). A task
// the view no longer has (never, while the view keeps what it was given)
// stops being counted. It returns how many it holds again.
func (p *Partition) Warmed(w *Warming, tasks []Task) int {
	n := 0
	for _, t := range tasks {
		if loading, ok := p.cold[t.ID]; ok && loading {
			p.Load(t)
			n++
		}
	}
	for _, c := range w.tasks {
		if loading, ok := p.cold[c.id]; ok && loading {
			delete(p.cold, c.id)
		}
	}
	if len(p.cold) == 0 {
		// A map never gives back its room: a drained backlog's goes now.
		p.cold = map[uuid.UUID]bool{}
		p.coldReady.items, p.coldDelayed.items = nil, nil
	}
	return n
}

// Unwarm puts the tasks of a read that failed back among the cold ones.
func (p *Partition) Unwarm(w *Warming) {
	for _, c := range w.tasks {
		if loading, ok := p.cold[c.id]; ok && loading {
			p.cold[c.id] = false
			if c.runAt <= p.now {
				stdheap.Push(&p.coldReady, c)
			} else {
				stdheap.Push(&p.coldDelayed, c)
			}
		}
	}
}
