package engine

import (
	"bytes"
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// A partition holds every queued task whole up to Limits.QueuedTasks. Past
// it, the queued tasks last in hand-out order go cold: the partition lets
// them go once the view has their state, and keeps only a count of them.
// The view's queued rows of the partition that it does not hold are the
// cold tasks: a cold task changes only once it is held again, so its row is
// the whole of it. When the partition holds half the bound or less, the
// owner reads the next ones in hand-out order back from the view (Warm,
// Warmed). Nothing of a cold task stays in memory, so a backlog of any size
// costs the owner the bound and no more.

// Cold is about how many queued tasks the partition holds only in the view:
// never fewer. A cold task held again by another way than Warmed (a
// requeue's or a completion's read of the view, a replayed record) is
// counted until a read back finds the view has no more.
func (p *Partition) Cold() int { return p.cold }

// SetCold tells a partition rebuilt from the view how many queued tasks the
// view holds past the bound (view.LoadLive left them out).
func (p *Partition) SetCold(n int) { p.cold = n }

// Queued is how many queued tasks the partition holds whole: those its
// ready and delayed indexes hold.
func (p *Partition) Queued() int {
	n := p.delayed.live
	for _, h := range p.ready {
		n += h.live
	}
	return n
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
	}
	p.cold += n
	if p.warming != nil {
		p.warming.chilled = true
	}
	// The entries let go are reachable from their stale index and hot
	// payload items, and a map never gives back its room: without these the
	// memory would stay.
	p.compactHot()
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

// Warming is a read of cold tasks back from the view under way: the view's
// next N queued tasks of the partition in hand-out order (ready ones by
// priority, run_at, created_at and id, then delayed ones soonest due),
// leaving out those the partition held when the read began (Held).
type Warming struct {
	// N is how many tasks to read.
	N int
	// Held are the tasks the partition held when the read began: the
	// view's rows of those may be older than the partition's state.
	Held []uuid.UUID
	// Now splits ready from delayed.
	Now time.Time
	// gone are the tasks the partition let go since (final ones the view
	// had): a row read before the view had their last state must not bring
	// them back. chilled says tasks went cold since.
	gone    map[uuid.UUID]struct{}
	chilled bool
}

// Warm begins a read of cold tasks back from the view, as many as bring the
// partition back to nine tenths of its bound; nil while the partition holds
// more than half the bound, has no cold task, or a read is under way.
func (p *Partition) Warm() *Warming {
	bound := p.limits.QueuedTasks
	if bound <= 0 || p.cold == 0 || p.warming != nil {
		return nil
	}
	queued := p.Queued()
	if queued > bound/2 {
		return nil
	}
	w := &Warming{N: bound - bound/10 - queued, Held: slices.Collect(maps.Keys(p.tasks)), Now: time.Unix(0, p.now).UTC(),
		gone: map[uuid.UUID]struct{}{}}
	p.warming = w
	return w
}

// Warmed holds again the tasks the read of w found (tasks, as the view has
// them) that are still cold: those the partition neither holds now nor let
// go since the read began. It returns how many it holds again.
func (p *Partition) Warmed(w *Warming, tasks []Task) int {
	if p.warming != w {
		return 0
	}
	p.warming = nil
	n := 0
	for _, t := range tasks {
		if _, gone := w.gone[t.ID]; gone || p.Has(t.ID) || t.Status != store.Queued {
			continue
		}
		p.Load(t)
		n++
	}
	p.cold = max(p.cold-n, 0)
	if len(tasks) < w.N && !w.chilled {
		// The view had no more cold tasks than these.
		p.cold = 0
	}
	return n
}

// Unwarm ends a read of w that failed; the next Warm tries again.
func (p *Partition) Unwarm(w *Warming) {
	if p.warming == w {
		p.warming = nil
	}
}
