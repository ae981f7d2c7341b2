package engine

import "bytes"

// item is one task's place in an index. Indexes delete lazily: an item whose
// gen is not its entry's any more is stale and skipped when it surfaces.
type item struct {
	at      int64 // due time in Unix nanoseconds (run_at, lease end, deadline), or an events offset
	created int64
	// id is the task id's first half, which settles ties without reaching
	// for the entry.
	id   uint64
	prio int32
	gen  uint32
	e    *entry
}

func (it *item) live() bool { return it.gen == it.e.gen }

// dueFirst orders by at, then id, so that what falls due at once is handled
// in one order everywhere (a rebuilt partition expires leases as the live
// one did).
func dueFirst(a, b *item) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return idLess(a, b)
}

// handOut orders ready tasks as claims take them: priority DESC, run_at,
// created_at, then id so that equal tasks go out in one order everywhere.
func handOut(a, b *item) bool {
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	if a.at != b.at {
		return a.at < b.at
	}
	if a.created != b.created {
		return a.created < b.created
	}
	return idLess(a, b)
}

func idLess(a, b *item) bool {
	if a.id != b.id {
		return a.id < b.id
	}
	return bytes.Compare(a.e.t.ID[8:], b.e.t.ID[8:]) < 0
}

// heap is a binary heap of items (container/heap would box each one).
type heap struct {
	items []item
	less  func(a, b *item) bool
	// live counts the items that are not stale, to know when to compact.
	live int
	// levels counts the live items by priority, in ready heaps only (nil
	// elsewhere), for claims that span partitions to take the highest
	// priorities first.
	levels map[int32]int
}

func (h *heap) push(it item) {
	h.live++
	if h.levels != nil {
		h.levels[it.prio]++
	}
	h.items = append(h.items, it)
	h.up(len(h.items) - 1)
	if len(h.items) > 64 && len(h.items) > 4*h.live {
		h.compact()
	}
}

// top returns the first live item, dropping stale ones above it; nil when
// there is none.
func (h *heap) top() *item {
	for len(h.items) > 0 {
		if h.items[0].live() {
			return &h.items[0]
		}
		h.remove()
	}
	return nil
}

// pop removes the top item, which top returned.
func (h *heap) pop() item {
	h.live--
	it := h.remove()
	h.drop(it.prio)
	return it
}

// drop uncounts a live item of priority prio that left the heap.
func (h *heap) drop(prio int32) {
	if h.levels == nil {
		return
	}
	if h.levels[prio]--; h.levels[prio] <= 0 {
		delete(h.levels, prio)
	}
}

func (h *heap) remove() item {
	it := h.items[0]
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	h.items[n] = item{}
	h.items = h.items[:n]
	if n > 0 {
		h.down(0)
	}
	return it
}

// stale tells the heap that one of its items, of priority prio, went stale.
func (h *heap) stale(prio int32) {
	h.live--
	h.drop(prio)
}

// compact drops stale items, so leases extended many times do not pile up.
func (h *heap) compact() {
	kept := h.items[:0]
	for _, it := range h.items {
		if it.live() {
			kept = append(kept, it)
		}
	}
	clear(h.items[len(kept):])
	h.items = kept
	for i := len(kept)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

// shrink gives back the room of a heap that lost most of its items.
func (h *heap) shrink() { h.items = shrunk(h.items) }

// shrunk gives items' room back once it holds a quarter of it or less.
func shrunk(items []item) []item {
	if cap(items) > 64 && cap(items) > 4*len(items) {
		return append(make([]item, 0, 2*len(items)), items...)
	}
	return items
}

func (h *heap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(&h.items[i], &h.items[parent]) {
			return
		}
		h.items[i], h.items[parent] = h.items[parent], h.items[i]
		i = parent
	}
}

func (h *heap) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		least := l
		if r := l + 1; r < n && h.less(&h.items[r], &h.items[l]) {
			least = r
		}
		if !h.less(&h.items[least], &h.items[i]) {
			return
		}
		h.items[i], h.items[least] = h.items[least], h.items[i]
		i = least
	}
}
