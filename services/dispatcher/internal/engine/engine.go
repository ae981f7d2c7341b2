// Package engine is the state machine of one partition of tasks, as the
// dispatcher replica that owns the partition holds it in memory: it creates,
// hands out, leases, retries, finishes and dead-letters tasks, and says each
// change it made as a Change, which the owner records on the task events log
// (Encode) before it answers anyone. A new owner rebuilds the same state from
// the view (Load) and the log (Decode, Apply).
//
// It does no I/O and is not safe for concurrent use: one goroutine owns a
// Partition.
package engine

import (
	"cmp"
	"encoding/binary"
	"time"

	"github.com/google/uuid"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// Task is one task as its partition's owner holds it (also what every event
// record's state encodes). Zero times are unset.
type Task struct {
	ID        uuid.UUID
	Namespace string
	Action    string
	Status    store.Status
	Priority  int32
	Payload   []byte
	Result    []byte
	Outcome   string
	Error     string
	ErrorCode string
	// TimedOut says the last attempt that ended ran out of time.
	TimedOut       bool
	IdempotencyKey string
	Attempt        int32
	// Settings are the action's, copied when the task was created.
	Settings     store.Settings
	WorkerID     string
	TraceContext map[string]string
	// Origin is who invoked the task; empty for plain invocations.
	Origin     string
	CreatedAt  time.Time
	RunAt      time.Time
	StartedAt  time.Time
	FinishedAt time.Time
	UpdatedAt  time.Time
	// LeaseUntil is set while running.
	LeaseUntil time.Time
	// CompletionSecret is drawn at each claim; with the id and attempt it
	// makes the attempt's completion token.
	CompletionSecret []byte
	// CompleteBy is set while waiting.
	CompleteBy time.Time
	// PayloadOut says the partition let the payload go from memory (see
	// Limits): Payload is empty and the view has it. Records do not carry
	// it.
	PayloadOut bool
}

// Row is the task as the API reads it.
func (t *Task) Row() store.Task {
	r := store.Task{
		ID: t.ID, Namespace: t.Namespace, Action: t.Action, Status: t.Status, Priority: t.Priority,
		Payload: t.Payload, Result: t.Result, Outcome: t.Outcome, Error: t.Error, TimedOut: t.TimedOut,
		ErrorCode: t.ErrorCode, IdempotencyKey: t.IdempotencyKey, Attempt: t.Attempt,
		MaxAttempts: t.Settings.MaxAttempts, WorkerID: t.WorkerID, CreatedAt: t.CreatedAt, RunAt: t.RunAt,
		StartedAt: t.StartedAt, FinishedAt: t.FinishedAt, UpdatedAt: t.UpdatedAt,
	}
	if t.Status == store.Waiting {
		r.CompleteBy = t.CompleteBy
	}
	return r
}

// Final says the task will not change again, unless a dead letter is requeued.
func (t *Task) Final() bool {
	return t.Status == store.Completed || t.Status == store.Failed || t.Status == store.DeadLettered
}

// Change is one recorded change: the event type and the task as it left it
// (a copy the caller may keep; its byte slices and maps are shared and must
// not be modified).
type Change struct {
	Type taskevent.Type
	Task Task
	// TraceHeaders, when set, are the W3C headers of the span that caused it
	// (a worker's report); else the task's own TraceContext is used.
	TraceHeaders map[string]string
	// made is the entry the change was made to, and gen its generation
	// right after: RecordedAll finds the entry through them, without a
	// lookup, while it has not changed since. Nil on changes of no held
	// task, and on those made elsewhere.
	made *entry
	gen  uint32
}

// madeTo is c marked as made to e, as it is now.
func (c Change) madeTo(e *entry) Change {
	c.made, c.gen = e, e.gen
	return c
}

// entry is a held task and where it is indexed.
type entry struct {
	t Task
	// gen changes with every change of t, which makes the items indexing
	// the earlier state stale.
	gen uint32
	// in is the index holding the entry's live item, nil when none.
	in *heap
	// last is the events offset of the task's last recorded change, -1
	// before any.
	last int64
	// pin says where the entry's payload waits to be let go (pinNone,
	// pinRecorded, pinHot).
	pin uint8
}

// queueKey names the ready tasks of one action.
type queueKey struct{ namespace, action string }

// compare orders queue keys by namespace, then action, so that what is done
// queue by queue is done in one order everywhere.
func (k queueKey) compare(o queueKey) int {
	return cmp.Or(cmp.Compare(k.namespace, o.namespace), cmp.Compare(k.action, o.action))
}

// Partition is the tasks of one partition.
type Partition struct {
	id    int32
	tasks map[uuid.UUID]*entry
	// ready holds each action's claimable tasks in hand-out order.
	ready map[queueKey]*heap
	// delayed holds queued tasks not claimable yet, by run_at; they move to
	// ready when due.
	delayed heap
	// leases holds running tasks by lease end, waiting ones by deadline.
	leases, deadlines heap
	// evictable holds final tasks by the offset of their last change.
	evictable heap
	// now is the latest time the partition was told (Unix nanoseconds):
	// queued tasks due by then go to ready at once.
	now int64

	limits Limits
	// payloadBytes is the length of every payload held.
	payloadBytes int64
	// recorded holds the held payloads whose last change the view may not
	// have yet, in record order; hot those it has, oldest first. hotLive
	// counts hot's items still pinned.
	recorded, hot []item
	hotLive       int
	// cold is what the partition knows of each queue's cold tasks (the
	// queued tasks only the view holds; coldSum counts them all), and
	// warming the read of some back under way (see cold.go).
	cold    map[queueKey]*coldQueue
	coldSum int
	warming *Warming
	// chilledAt is the view offset of the last look for tasks to let go
	// cold.
	chilledAt int64
}

// New returns an empty partition.
func New(id int32) *Partition {
	return &Partition{
		id:        id,
		tasks:     map[uuid.UUID]*entry{},
		ready:     map[queueKey]*heap{},
		delayed:   heap{less: dueFirst},
		leases:    heap{less: dueFirst},
		deadlines: heap{less: dueFirst},
		evictable: heap{less: dueFirst},
		chilledAt: -1,
		cold:      map[queueKey]*coldQueue{},
	}
}

// ID is the partition's number.
func (p *Partition) ID() int32 { return p.id }

// Has reports whether the task is held: live and not cold, or final and
// not yet evicted.
func (p *Partition) Has(id uuid.UUID) bool {
	_, ok := p.tasks[id]
	return ok
}

// Get returns a held task.
func (p *Partition) Get(id uuid.UUID) (Task, bool) {
	e, ok := p.tasks[id]
	if !ok {
		return Task{}, false
	}
	return e.t, true
}

// Len is how many tasks the partition holds.
func (p *Partition) Len() int { return len(p.tasks) }

// Load puts a task read from the view into the partition as it is (a
// rebuild, a cold task read back, or a task evicted earlier that a requeue
// or a completion needs). A final task
// loaded is evicted at the next Materialized unless it changes first. A
// task already held keeps its state: only its payload, when the partition
// let it go, is taken from t. A t with PayloadOut set was read without its
// payload (the view has it), which stays out. A queued task the partition
// did not hold was cold, so its queue counts one fewer (a rebuild loads
// before it counts).
func (p *Partition) Load(t Task) {
	if e, ok := p.tasks[t.ID]; ok {
		if e.t.PayloadOut && !t.PayloadOut {
			p.payloadBytes += int64(len(t.Payload))
			e.t.Payload, e.t.PayloadOut = t.Payload, false
			p.pinPayload(e)
		}
		return
	}
	if t.Status == store.Queued {
		p.addCold(queueKey{t.Namespace, t.Action}, -1)
	}
	p.see(t.UpdatedAt)
	e := p.hold(t.ID)
	if t.PayloadOut {
		t.Payload = nil
	}
	p.put(e, t)
	e.last = -1
	p.pinPayload(e)
	if t.Final() {
		p.evictable.push(item{at: -1, gen: e.gen, e: e})
	}
}

// Apply replays one recorded change during a rebuild: the task becomes
// c.Task, keeping the held payload and result when c.Task has none (records
// carry the payload only when they bring the task to life).
func (p *Partition) Apply(c Change) {
	if c.Type == taskevent.Rejected {
		return // no task was created
	}
	t := c.Task
	p.see(t.UpdatedAt)
	// Only the records that bring a task to life carry its payload. One
	// that finds the task not held is about one the rebuild left in the
	// view (cold or final there), whose payload the view has. Whether its
	// queue counted it the view's snapshot says, not the record: the
	// rebuild counts cold tasks after its replay (SetCold).
	out := !p.Has(t.ID) && c.Type != taskevent.Created
	e := p.hold(t.ID)
	if len(t.Payload) == 0 {
		t.Payload, t.PayloadOut = e.t.Payload, e.t.PayloadOut || out
	}
	if len(t.Result) == 0 {
		t.Result = e.t.Result
	}
	p.put(e, t)
}

// Recorded tells the partition that a change of task id was committed at
// this events offset.
func (p *Partition) Recorded(id uuid.UUID, offset int64) {
	if e, ok := p.tasks[id]; ok {
		p.recorded1(e, offset)
	}
}

// RecordedAll tells the partition that each of changes, which it made, was
// committed at the offset of the same index. A change whose entry has not
// changed since (no later change, no eviction: each moves its generation on)
// reaches it directly; looking each task up again was a tenth of a loaded
// partition's CPU, most of it waiting on memory.
func (p *Partition) RecordedAll(changes []Change, offsets []int64) {
	for i := range changes {
		if c := &changes[i]; c.made != nil && c.made.gen == c.gen {
			p.recorded1(c.made, offsets[i])
		} else {
			p.Recorded(c.Task.ID, offsets[i])
		}
	}
}

// recorded1 records that e's last change was committed at offset.
func (p *Partition) recorded1(e *entry, offset int64) {
	e.last = offset
	p.pinPayload(e)
	if e.t.Final() {
		p.evictable.push(item{at: offset, gen: e.gen, e: e})
	}
}

// Materialized tells the partition that the view holds every change up to
// and including this events offset: final tasks whose last change is in the
// view are let go, since the view answers for them from now on, and so are
// payloads the Limits do not leave room for.
func (p *Partition) Materialized(offset int64) {
	h := &p.evictable
	for len(h.items) > 0 && h.items[0].at <= offset {
		it := h.pop()
		e := it.e
		if it.live() && it.at == e.last && e.t.Final() && p.tasks[e.t.ID] == e {
			delete(p.tasks, e.t.ID)
			e.gen++
			p.unpin(e)
			p.payloadBytes -= int64(len(e.t.Payload))
			if p.warming != nil {
				p.warming.gone[e.t.ID] = struct{}{}
			}
		}
	}
	p.shed(offset)
	p.chill(offset)
}

// hold returns the entry of id, new when the task is not held.
func (p *Partition) hold(id uuid.UUID) *entry {
	e, ok := p.tasks[id]
	if !ok {
		e = &entry{last: -1}
		p.tasks[id] = e
	}
	return e
}

// see moves the partition's clock to at when at is later.
func (p *Partition) see(at time.Time) {
	if at.IsZero() {
		return
	}
	if n := at.UnixNano(); n > p.now {
		p.now = n
	}
}

// put sets e's task to t and indexes it by its new state.
func (p *Partition) put(e *entry, t Task) {
	e.gen++
	if e.in != nil {
		// e.t is still the task e was indexed as.
		e.in.stale(e.t.Priority)
		e.in = nil
	}
	p.payloadBytes += int64(len(t.Payload) - len(e.t.Payload))
	e.t = t
	var h *heap
	it := item{gen: e.gen, e: e, id: binary.BigEndian.Uint64(t.ID[:8])}
	switch t.Status {
	case store.Queued:
		it.at = t.RunAt.UnixNano()
		if it.at <= p.now {
			h = p.queue(t.Namespace, t.Action)
			it.prio, it.created = t.Priority, t.CreatedAt.UnixNano()
		} else {
			h = &p.delayed
		}
	case store.Running:
		h, it.at = &p.leases, t.LeaseUntil.UnixNano()
	case store.Waiting:
		h, it.at = &p.deadlines, t.CompleteBy.UnixNano()
	default:
		return
	}
	h.push(it)
	e.in = h
}

// take removes the top item of h, which h.top returned, and returns its entry.
func take(h *heap) *entry {
	e := h.pop().e
	e.in = nil
	return e
}

// queue returns the ready heap of an action, made on first use.
func (p *Partition) queue(namespace, action string) *heap {
	k := queueKey{namespace, action}
	h, ok := p.ready[k]
	if !ok {
		h = &heap{less: handOut, levels: map[int32]int{}}
		p.ready[k] = h
	}
	return h
}

// advance moves the clock to now and the queued tasks due by then to ready.
func (p *Partition) advance(now time.Time) {
	p.see(now)
	for {
		it := p.delayed.top()
		if it == nil || it.at > p.now {
			return
		}
		e := take(&p.delayed)
		p.put(e, e.t)
	}
}
