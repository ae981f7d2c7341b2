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
// it, queued tasks go cold: the partition lets them go once the view has
// their state, and keeps only a count of them per queue. The view's queued
// rows of the partition that it does not hold are the cold tasks: a cold
// task changes only once it is held again, so its row is the whole of it.
// The tasks that go are the last in hand-out order of the queues that hold
// the most, so a queue nobody claims from (an action without workers) fills
// the partition without pushing other queues' tasks out. When the partition
// holds half the bound or less, the owner reads the next ones in hand-out
// order back from the view; a queue reads its own back when it runs low on
// ready tasks while others fill the partition, or when the next task it
// would hand out comes after one of its cold ones (Warm, Warmed). Nothing
// of a cold task stays in memory, so a backlog of any size costs the owner
// the bound and no more.

// coldRetry is how long a queue whose read of its own cold tasks found
// fewer ready ones than it asked for waits before it reads again: the rest
// of its cold tasks, if any, are delayed ones, which come due with time.
const coldRetry = time.Second

// coldQueue is what a partition knows of one queue's cold tasks.
type coldQueue struct {
	// n is about how many there are: never fewer.
	n int
	// retryAt is when the queue may read its own again after a read found
	// fewer ready ones than it asked for (Unix nanoseconds).
	retryAt int64
	// from, when set, comes before or at every cold task of the queue that
	// was ready when it went cold (or when a read of the queue began): the
	// queue reads those back, from there on, before it hands out a task
	// that comes after from. Only tasks the view has go cold, and the view
	// writes a live state late, so under a steady backlog the tasks that go
	// cold are older than the newest held; without from those newer ones
	// would go out first for as long as the backlog lasted. unplaced says
	// where they begin is not known (a rebuilt partition): the queue reads
	// from its start before it hands out anything.
	from     *Place
	unplaced bool
	// due and dueLast bound when the queue's cold delayed tasks come due
	// (Unix nanoseconds; due 0 when none is known to be waiting). A
	// delayed task come due may belong before the queue's next held task
	// (a higher priority, or no cold ready task before it to read from),
	// so from due on the queue reads its ready cold tasks before its next
	// held one, at most once a coldRetry, until dueLast has passed.
	// Without it such a task came back only once the queue ran low, which
	// a steady backlog never lets it do.
	due, dueLast int64
}

// delayedCold notes a delayed task of the queue due at runAt (Unix
// nanoseconds) that went, or may have gone, cold.
func (c *coldQueue) delayedCold(runAt int64) {
	if c.due == 0 || runAt < c.due {
		c.due = runAt
	}
	c.dueLast = max(c.dueLast, runAt)
}

// Place is a queued task's place in its queue's hand-out order: priority
// DESC, run_at, created_at, id.
type Place struct {
	Priority         int32
	RunAt, CreatedAt time.Time
	ID               uuid.UUID
}

// placeOf is t's place, its times to the microsecond as the view keeps
// them: never after the place the view's row has, so a read from it finds
// the row.
func placeOf(t *Task) Place {
	return Place{Priority: t.Priority, RunAt: t.RunAt.Truncate(time.Microsecond), CreatedAt: t.CreatedAt.Truncate(time.Microsecond), ID: t.ID}
}

// compare orders places as claims hand tasks out.
func (a Place) compare(b Place) int {
	return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.RunAt.Compare(b.RunAt), a.CreatedAt.Compare(b.CreatedAt),
		bytes.Compare(a.ID[:], b.ID[:]))
}

// Cold is about how many queued tasks the partition holds only in the view:
// never fewer. A cold task held again comes off its queue's count when it
// comes back by a read back or a call that loads its row (a rebuild whose
// replay took cold tasks in again counts them off itself, in SetCold); a
// read back of the whole partition that finds fewer rows than it asked for
// sets every count to zero. A count below the truth would leave tasks in
// the view that no read ever brings back.
func (p *Partition) Cold() int { return p.coldSum }

// SetCold tells a partition rebuilt from the view and the log how many
// queued tasks of the queue of namespace and action only the view holds:
// those view.LoadLive left out, less those the replay took in again. Where
// they are in the queue is not known, so the queue reads its first ones
// back before it hands out any task.
//
// Its delayed cold tasks are due from due to dueLast (zero times when it
// has none): SetCold reads them as the view's rows say.
func (p *Partition) SetCold(namespace, action string, n int, due, dueLast time.Time) {
	k := queueKey{namespace, action}
	if c := p.cold[k]; c != nil {
		n -= c.n
	}
	if c := p.addCold(k, n); c != nil {
		c.from, c.unplaced = nil, true
		if !due.IsZero() {
			c.delayedCold(due.UnixNano())
			c.delayedCold(dueLast.UnixNano())
		}
	}
}

// addCold moves the cold count of queue k by n, never below zero, and
// returns what the partition knows of the queue's cold tasks, nil when it
// has none.
func (p *Partition) addCold(k queueKey, n int) *coldQueue {
	c := p.cold[k]
	if c == nil {
		c = &coldQueue{}
	}
	was := c.n
	c.n = max(c.n+n, 0)
	p.coldSum += c.n - was
	if c.n == 0 {
		delete(p.cold, k)
		return nil
	}
	p.cold[k] = c
	return c
}

// Queued is how many queued tasks the partition holds whole: those its
// ready and delayed indexes hold.
func (p *Partition) Queued() int {
	n := p.delayed.live
	for _, h := range p.ready {
		n += h.live
	}
	return n
}

// chill lets queued tasks go cold once the partition holds more than the
// bound by a tenth, down to nine tenths of it. It takes from the queue that
// holds the most tasks until it holds no more than the next, then from
// both, and so on; within a queue the delayed ones go first, the latest due
// first, then ready ones from the end. Only tasks whose state the view has
// (changes up to offset) go.
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
		ready, before bool
		e             *entry
	}
	type queue struct {
		k     queueKey
		held  int
		cands []candidate
		// heldAfter says a ready task after where the queue's cold ones
		// begin stays held (the view lacks it).
		heldAfter bool
	}
	var queues []*queue
	byKey := map[queueKey]*queue{}
	of := func(k queueKey) *queue {
		q, ok := byKey[k]
		if !ok {
			q = &queue{k: k}
			byKey[k] = q
			queues = append(queues, q)
		}
		return q
	}
	add := func(h *heap, ready bool) {
		for i := range h.items {
			it := &h.items[i]
			if !it.live() {
				continue
			}
			k := queueKey{it.e.t.Namespace, it.e.t.Action}
			q := of(k)
			q.held++
			before := ready && p.beforeCold(k, &it.e.t)
			viewed := it.e.last <= offset
			switch {
			case viewed:
				q.cands = append(q.cands, candidate{ready: ready, before: before, e: it.e})
			case ready && !before:
				q.heldAfter = true
			}
		}
	}
	add(&p.delayed, false)
	for _, h := range p.ready {
		add(h, true)
	}
	for _, q := range queues {
		// A ready task before where the queue's cold ones begin goes out
		// before them. While a later one stays held, letting it go would
		// turn the order round (the read back under way would bring it in
		// again, to go again); once none does, the cold ones just begin
		// earlier.
		if q.heldAfter {
			q.cands = slices.DeleteFunc(q.cands, func(c candidate) bool { return c.before })
		}
		slices.SortFunc(q.cands, func(a, b candidate) int {
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
	}
	// The ties go to the queue first in key order, so a replay chills as
	// the live partition did.
	slices.SortFunc(queues, func(a, b *queue) int { return a.k.compare(b.k) })
	n := queued - (bound - bound/10)
	chilled := 0
	for n > 0 {
		var top *queue
		next := 0
		for _, q := range queues {
			switch {
			case len(q.cands) > 0 && (top == nil || q.held > top.held):
				if top != nil {
					next = max(next, top.held)
				}
				top = q
			default:
				next = max(next, q.held)
			}
		}
		if top == nil {
			break
		}
		k := min(max(top.held-next, 1), len(top.cands), n)
		cq := p.addCold(top.k, k)
		// A task of the queue went cold: it may be ready.
		cq.retryAt = 0
		for _, c := range top.cands[:k] {
			e := c.e
			if c.ready {
				if at := placeOf(&e.t); cq.from == nil || at.compare(*cq.from) < 0 {
					cq.from = &at
				}
			} else {
				cq.delayedCold(e.t.RunAt.UnixNano())
			}
			e.in.stale(e.t.Priority)
			e.in = nil
			e.gen++
			p.unpin(e)
			p.payloadBytes -= int64(len(e.t.Payload))
			delete(p.tasks, e.t.ID)
		}
		top.cands, top.held, n, chilled = top.cands[k:], top.held-k, n-k, chilled+k
	}
	if chilled == 0 {
		return
	}
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
	if chilled > len(p.tasks) {
		tasks := make(map[uuid.UUID]*entry, len(p.tasks))
		maps.Copy(tasks, p.tasks)
		p.tasks = tasks
	}
}

// Warming is a read of cold tasks back from the view under way: the view's
// next N queued tasks of the partition in hand-out order (ready ones by
// priority, run_at, created_at and id, then delayed ones soonest due), or,
// when Namespace and Action are set, the next N ready ones of that queue;
// leaving out those the partition held when the read began (Held).
type Warming struct {
	// N is how many tasks to read.
	N int
	// Namespace and Action name the one queue read, both empty for all;
	// From, when set, is where in the queue's hand-out order the read
	// starts (at From or after): no cold task of the queue comes before it.
	Namespace, Action string
	From              *Place
	// Before, when set, ends a read of one queue: it reads the queue's
	// ready tasks before that place only, from the queue's start (the
	// queue's next held task; a read for delayed tasks come due).
	Before *Place
	// Held are the tasks the partition held when the read began (those of
	// the queue for a read of one queue from its start, those of it not
	// queued for a read before Before, none for a read from From): the
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

// OneQueue says whether w reads the cold tasks of one queue only.
func (w *Warming) OneQueue() bool { return w.Namespace != "" || w.Action != "" }

// Warm begins a read of cold tasks back from the view; nil when there is
// none to begin. While the partition holds half the bound or less it reads
// the partition's next ones, as many as bring it back to nine tenths of the
// bound. Otherwise a queue with cold tasks reads a tenth of the bound of
// its own next ready ones when it holds a twentieth of the bound or fewer
// ready tasks (so a queue nobody claims from cannot keep another's tasks
// in the view), when the next task it would hand out comes after where
// its cold ones begin, or, while its cold delayed tasks come due, those
// before the next task it would hand out. One read at a time.
func (p *Partition) Warm() *Warming {
	bound := p.limits.QueuedTasks
	if bound <= 0 || p.coldSum == 0 || p.warming != nil {
		return nil
	}
	w := &Warming{Now: time.Unix(0, p.now).UTC(), gone: map[uuid.UUID]struct{}{}}
	if queued := p.Queued(); queued <= bound/2 {
		w.N, w.Held = bound-bound/10-queued, slices.Collect(maps.Keys(p.tasks))
		p.warming = w
		return w
	}
	low := max(bound/20, 1)
	var (
		want *queueKey
		kind queueRead
	)
	for k, c := range p.cold {
		r := p.due(k, c, low)
		if r == noRead {
			continue
		}
		if want == nil || k.compare(*want) < 0 {
			want, kind = &k, r
		}
	}
	if want == nil {
		return nil
	}
	w.N, w.Namespace, w.Action = max(bound/10, 1), want.namespace, want.action
	switch kind {
	case readFrom:
		// A read from where the queue's cold tasks begin leaves nothing
		// out: the held tasks after it are mostly ones the view has no row
		// of yet, and Warmed skips the rows of those it has. The list would
		// cost more than the rows.
		w.From = p.cold[*want].from
	case readDue:
		// The tasks held queued are ready ones, which all come at or after
		// the next one, or delayed ones, which the read leaves out: only
		// the others (leased ones, whose rows the view may still have
		// queued) are left out by id.
		at := placeOf(&p.ready[*want].top().e.t)
		w.Before = &at
		w.Held = p.heldOf(*want, func(e *entry) bool { return e.t.Status != store.Queued })
	default:
		w.Held = p.heldOf(*want, func(*entry) bool { return true })
	}
	p.warming = w
	return w
}

// heldOf lists the tasks of queue k the partition holds that keep says.
func (p *Partition) heldOf(k queueKey, keep func(*entry) bool) []uuid.UUID {
	var ids []uuid.UUID
	for id, e := range p.tasks {
		if e.t.Namespace == k.namespace && e.t.Action == k.action && keep(e) {
			ids = append(ids, id)
		}
	}
	return ids
}

// queueRead is how a queue reads its own cold tasks back.
type queueRead int

const (
	noRead        queueRead = iota
	readFromStart           // its next ready ones from its start
	readFrom                // its next ready ones from where they begin
	readDue                 // its ready ones before its next held task
)

// due says whether and how queue k, whose cold tasks c tells of, reads
// its own back. It does from its start when it holds low ready tasks or
// fewer (and no read of it found too few within coldRetry), or when where
// its cold tasks begin is not known; from c.from on when its next task
// comes after c.from; and, while its cold delayed tasks come due, those
// before its next task.
func (p *Partition) due(k queueKey, c *coldQueue, low int) queueRead {
	h := p.ready[k]
	switch {
	case h == nil || h.live <= low:
		if p.now >= c.retryAt {
			return readFromStart
		}
		return noRead
	case c.unplaced:
		return readFromStart
	}
	top := h.top()
	switch {
	case top == nil:
		return noRead
	case c.from != nil && placeOf(&top.e.t).compare(*c.from) > 0:
		return readFrom
	case c.due != 0 && p.now >= c.due:
		return readDue
	}
	return noRead
}

// beforeCold says whether t, a ready task of queue k, comes before where
// the queue's cold tasks begin.
func (p *Partition) beforeCold(k queueKey, t *Task) bool {
	c := p.cold[k]
	return c != nil && c.from != nil && !c.unplaced && placeOf(t).compare(*c.from) < 0
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
	if w.chilled {
		// Tasks went cold during the read, before or among those it found:
		// what the partition knows of them stands.
		return n
	}
	one := w.OneQueue()
	switch {
	case w.Before != nil:
		if c := p.cold[queueKey{w.Namespace, w.Action}]; c != nil {
			c.readDue(w, tasks)
		}
	case len(tasks) < w.N && !one:
		// The view had no more cold tasks than these.
		clear(p.cold)
		p.coldSum = 0
	case len(tasks) < w.N:
		// The queue has no more ready cold tasks; delayed ones of it may
		// come due.
		if c := p.cold[queueKey{w.Namespace, w.Action}]; c != nil {
			c.retryAt, c.from, c.unplaced = w.Now.Add(coldRetry).UnixNano(), nil, false
		}
	case one:
		// The queue's other cold tasks that were ready come after the last
		// one read.
		if c := p.cold[queueKey{w.Namespace, w.Action}]; c != nil {
			at := placeOf(&tasks[len(tasks)-1])
			c.from, c.unplaced = &at, false
		}
	default:
		// The ready ones came first: every cold task that was ready comes
		// after the last of them, and after where its queue's began; a read
		// that reached delayed ones read every ready one.
		last := tasks[len(tasks)-1]
		at := placeOf(&last)
		for _, c := range p.cold {
			switch {
			case last.RunAt.After(w.Now):
				c.from = nil
			case c.unplaced || c.from != nil && at.compare(*c.from) > 0:
				c.from = &at
			}
			c.unplaced = false
		}
	}
	return n
}

// readDue notes what a read of the queue's ready cold tasks before
// w.Before found (tasks, w.N at most): every cold task ready by then that
// comes before the last of them, or before w.Before when they were fewer,
// is held now, so the queue's cold ready tasks begin there at the latest.
// It reads again a coldRetry later while its delayed ones may still come
// due.
func (c *coldQueue) readDue(w *Warming, tasks []Task) {
	at := *w.Before
	if len(tasks) == w.N {
		at = placeOf(&tasks[len(tasks)-1])
	}
	if c.from == nil || at.compare(*c.from) < 0 {
		c.from = &at
	}
	if now := w.Now.UnixNano(); now < c.dueLast {
		c.due = w.Now.Add(coldRetry).UnixNano()
	} else {
		c.due, c.dueLast = 0, 0
	}
}

// Unwarm ends a read of w that failed; the next Warm tries again.
func (p *Partition) Unwarm(w *Warming) {
	if p.warming == w {
		p.warming = nil
	}
}
