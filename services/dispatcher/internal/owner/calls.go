package owner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
	"github.com/razorbill/flo/services/dispatcher/internal/view"
)

// Limits on one claim.
const (
	MaxClaimCount = 1000
	MaxClaimWait  = 5 * time.Minute
	MaxLease      = 24 * time.Hour
)

// unseenWait bounds how long a read of an id the partition has not seen
// waits for the partition to apply the commands already on the log: the
// id may be an invocation accepted a moment ago.
const unseenWait = 5 * time.Second

// ClaimRequest asks for tasks of Actions for the workers of Slots.
type ClaimRequest struct {
	Namespace string
	// Slots are the workers the claim is for, each with how many tasks it
	// takes; one waiting claim serves them all.
	Slots   []Slot
	Actions []string
	// Wait is how long to wait for work when none is ready.
	Wait time.Duration
	// Lease is the lease length; zero means each task's timeout.
	Lease time.Duration
	// ID names a waiting claim for EndClaim; empty when nobody ends it.
	ID string
}

// Slot is one worker's share of a claim: up to Count tasks (zero means one).
type Slot struct {
	WorkerID string
	Count    int
}

// turns lays the slots out as one engine slot per task, in turn: one to
// each slot with count left, then again, so that a burst smaller than the
// claim spreads over its workers instead of filling the first.
func turns(slots []Slot, lease time.Duration) []engine.Slot {
	total := 0
	left := make([]int, len(slots))
	active := make([]int, len(slots))
	for i, s := range slots {
		left[i], active[i] = s.Count, i
		total += s.Count
	}
	out := make([]engine.Slot, 0, total)
	for len(active) > 0 {
		next := active[:0]
		for _, i := range active {
			out = append(out, engine.Slot{WorkerID: slots[i].WorkerID, Lease: lease})
			if left[i]--; left[i] > 0 {
				next = append(next, i)
			}
		}
		active = next
	}
	return out
}

// Claim leases tasks of the partitions this replica owns to the request's
// slots, waiting up to req.Wait for some to become ready. Each task's
// WorkerID names the slot's worker it went to. It returns no tasks and no
// error when the wait ran out.
func (r *Replica) Claim(ctx context.Context, req ClaimRequest) ([]engine.Claimed, error) {
	req, err := r.validateClaim(ctx, req)
	if err != nil {
		return nil, err
	}
	slots := turns(req.Slots, req.Lease)
	actions, err := r.cat.Claimable(ctx, req.Namespace, req.Actions)
	if err != nil {
		return nil, err
	}
	var ended <-chan struct{}
	if req.ID != "" && req.Wait > 0 {
		ch, done, err := r.ends.open(req.ID)
		if err != nil {
			return nil, err
		}
		defer done()
		ended = ch
	}
	var got []engine.Claimed
	if len(actions) > 0 {
		start := time.Now()
		if got, err = r.claimOnce(ctx, req.Namespace, actions, slots); err != nil {
			return nil, err
		}
		r.metrics.claimPass.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attribute.String("namespace", req.Namespace)))
	}
	if len(got) == 0 && req.Wait > 0 {
		got, err = r.wait(ctx, req, actions, slots, ended)
	}
	if err == nil {
		// After the claim's transaction: partitions never wait on Postgres.
		if err = r.fillPayloads(ctx, got); err != nil {
			go r.giveBackAll(req.Namespace, got)
			got = nil
		}
	}
	if len(got) > 0 && ctx.Err() != nil {
		// The caller gave up while the leases were being recorded (a gateway
		// gives up on a replica slow to answer, or cancels a claim EndClaim
		// did not find): the answer would be dropped, and the tasks would
		// wait for their leases to end.
		go r.giveBackAll(req.Namespace, got)
		got, err = nil, ctx.Err()
	}
	r.metrics.started(ctx, got)
	return got, err
}

// actionsRecheck is how often a waiting claim reads which of its actions
// are enabled, so enabling one serves the claim without a new call.
const actionsRecheck = time.Second

// wait parks the claim for its claimable actions at every partition until
// one leases it tasks, the wait ends or is ended (ended closes), the replica
// closes or ctx ends.
func (r *Replica) wait(ctx context.Context, req ClaimRequest, claimable []string, slots []engine.Slot, ended <-chan struct{}) ([]engine.Claimed, error) {
	deadline := time.NewTimer(req.Wait)
	defer deadline.Stop()
	recheck := time.NewTicker(actionsRecheck)
	defer recheck.Stop()
	var s *standing
	leave := func() []engine.Claimed {
		if s == nil {
			return nil
		}
		r.unpark(s)
		return s.close()
	}
	var actions []string
	for {
		if !slices.Equal(claimable, actions) {
			if got := leave(); len(got) > 0 {
				return got, nil
			}
			actions, s = claimable, nil
			if len(actions) > 0 {
				s = newStanding(req.Namespace, actions, slots)
				r.park(s)
				// Tasks that became ready before the claim was parked are
				// served by the batch this starts.
				for _, p := range r.owned() {
					if p.readyFor(req.Namespace, actions) > 0 {
						p.poke()
					}
				}
			}
		}
		var signal <-chan struct{}
		if s != nil {
			signal = s.signal
		}
		select {
		case <-signal:
			if got, ok := s.finishIfServed(); ok {
				r.unpark(s)
				return got, nil
			}
		case <-recheck.C:
			var err error
			if claimable, err = r.cat.Claimable(ctx, req.Namespace, req.Actions); err != nil {
				return leave(), err
			}
		case <-deadline.C:
			return leave(), nil
		case <-ended:
			return leave(), nil
		case <-r.closing:
			return leave(), nil
		case <-ctx.Done():
			if got := leave(); len(got) > 0 {
				go r.giveBackAll(req.Namespace, got)
			}
			return nil, ctx.Err()
		}
	}
}

// EndClaim ends the wait of this replica's claim named id, which then
// answers with what it was leased by now. It reports whether such a claim
// was waiting here.
func (r *Replica) EndClaim(id string) (bool, error) {
	if err := text.Key("claim_id", id); err != nil {
		return false, err
	}
	return r.ends.end(id), nil
}

// claimEnds holds, for each waiting claim that has an id, the channel
// EndClaim closes.
type claimEnds struct {
	mu   sync.Mutex
	byID map[string]chan struct{}
}

// open registers id and returns its channel, and done, which forgets it.
// An id already waiting is refused: ending it would end both.
func (e *claimEnds) open(id string) (<-chan struct{}, func(), error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.byID[id]; ok {
		return nil, nil, fault.Invalidf("claim_id %q names a claim already waiting", id)
	}
	if e.byID == nil {
		e.byID = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	e.byID[id] = ch
	return ch, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.byID[id] == ch {
			delete(e.byID, id)
		}
	}, nil
}

// end closes the channel of id, if it is waiting, and forgets it.
func (e *claimEnds) end(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	ch, ok := e.byID[id]
	if ok {
		close(ch)
		delete(e.byID, id)
	}
	return ok
}

func (r *Replica) validateClaim(ctx context.Context, req ClaimRequest) (ClaimRequest, error) {
	if err := r.cat.CheckNamespace(ctx, req.Namespace); err != nil {
		return req, err
	}
	if err := text.Key("claim_id", req.ID); err != nil {
		return req, err
	}
	if len(req.Actions) == 0 {
		return req, fault.Invalidf("actions must name at least one action")
	}
	for _, a := range req.Actions {
		if err := text.Name("actions", a); err != nil {
			return req, err
		}
	}
	if len(req.Slots) == 0 {
		return req, fault.Invalidf("slots must name at least one worker")
	}
	// The total is capped at MaxClaimCount: the slots past it are dropped,
	// the last one kept may be cut short.
	slots := make([]Slot, 0, min(len(req.Slots), MaxClaimCount))
	total := 0
	for i, s := range req.Slots {
		if err := text.WorkerID(fmt.Sprintf("slots[%d].worker_id", i), s.WorkerID); err != nil {
			return req, err
		}
		if s.Count < 0 {
			return req, fault.Invalidf("slots[%d].count must not be negative, got %d", i, s.Count)
		}
		if n := min(max(s.Count, 1), MaxClaimCount-total); n > 0 {
			slots = append(slots, Slot{WorkerID: s.WorkerID, Count: n})
			total += n
		}
	}
	req.Slots = slots
	if req.Wait < 0 {
		return req, fault.Invalidf("wait_ms must not be negative")
	}
	req.Wait = min(req.Wait, MaxClaimWait)
	if req.Lease < 0 {
		return req, fault.Invalidf("lease_ms must not be negative")
	}
	req.Lease = min(req.Lease, MaxLease)
	return req, nil
}

// claimOnce asks the partitions that counted ready tasks of the actions,
// starting at a rotating one so no partition is always served first, for
// no more than each counted and len(slots) in all; each partition gets the
// next of the slots.
func (r *Replica) claimOnce(ctx context.Context, ns string, actions []string, slots []engine.Slot) ([]engine.Claimed, error) {
	parts := r.owned()
	if len(parts) == 0 {
		return nil, nil
	}
	asks := r.shareOut(parts, ns, actions, slots)
	if len(asks) == 1 {
		return r.claimFrom(ctx, asks[0], ns, actions)
	}
	// Each partition's answer goes in its own place, and the claim's array
	// is made once, to size: a claimed task is a large value.
	got := make([][]engine.Claimed, len(asks))
	errs := make([]error, len(asks))
	var wg sync.WaitGroup
	for i, a := range asks {
		wg.Go(func() {
			got[i], errs[i] = r.claimFrom(ctx, a, ns, actions)
		})
	}
	wg.Wait()
	n := 0
	for _, g := range got {
		n += len(g)
	}
	if n > 0 {
		out := make([]engine.Claimed, 0, n)
		for _, g := range got {
			out = append(out, g...)
		}
		// Each partition hands out in priority order; the claim keeps that
		// order across them.
		slices.SortStableFunc(out, func(a, b engine.Claimed) int {
			return cmp.Or(cmp.Compare(b.Task.Priority, a.Task.Priority), a.Task.RunAt.Compare(b.Task.RunAt), a.Task.CreatedAt.Compare(b.Task.CreatedAt))
		})
		return out, nil
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// ask is the part of a claim one partition is asked for: slots, filled
// with tasks of priority floor or higher.
type ask struct {
	p     *partition
	slots []engine.Slot
	floor int32
}

// shareOut splits a claim's slots among the partitions with claimable
// tasks: the highest priorities of all of them first, and within a
// priority the partitions in turn, starting at a rotating one. Each
// partition hands out its own tasks highest priority first, so the claim
// gets the highest-priority tasks the replica has.
func (r *Replica) shareOut(parts []*partition, ns string, actions []string, slots []engine.Slot) []ask {
	turn := int(r.claimTurn.Add(1)) % len(parts)
	type have struct {
		p          *partition
		levels     []engine.Level
		next, take int
		floor      int32
	}
	var (
		buf    [16]engine.Level
		levels = buf[:0]
		starts = make([]int, 0, len(parts)+1)
		haves  = make([]have, 0, len(parts))
	)
	for i := range parts {
		p := parts[(turn+i)%len(parts)]
		start := len(levels)
		if levels = p.levelsFor(ns, actions, levels); len(levels) > start {
			starts = append(starts, start)
			haves = append(haves, have{p: p})
		}
	}
	starts = append(starts, len(levels))
	for i := range haves {
		haves[i].levels = levels[starts[i]:starts[i+1]]
	}
	for left := len(slots); left > 0; {
		var prio int32
		found := false
		for _, h := range haves {
			if h.next < len(h.levels) && (!found || h.levels[h.next].Priority > prio) {
				prio, found = h.levels[h.next].Priority, true
			}
		}
		if !found {
			break
		}
		for i := range haves {
			h := &haves[i]
			if left == 0 || h.next == len(h.levels) || h.levels[h.next].Priority != prio {
				continue
			}
			n := min(h.levels[h.next].Count, left)
			h.take += n
			h.floor = prio
			left -= n
			h.next++
		}
	}
	asks := make([]ask, 0, len(haves))
	for _, h := range haves {
		if h.take > 0 {
			asks = append(asks, ask{h.p, slots[:h.take:h.take], h.floor})
			slots = slots[h.take:]
		}
	}
	return asks
}

// FlushView writes what this replica's partitions recorded to the view now,
// for reads over many tasks (dead-letter listings) that should see every
// change made through this replica.
func (r *Replica) FlushView(ctx context.Context) error { return r.mat.Flush(ctx) }

// claimFrom leases up to len(slots) tasks from one partition. A partition
// that stops meanwhile gives nothing, not an error: another claim finds the
// tasks at their new owner.
func (r *Replica) claimFrom(ctx context.Context, a ask, ns string, actions []string) ([]engine.Claimed, error) {
	p := a.p
	o := &claimOp{ns: ns, actions: actions, slots: a.slots, floor: a.floor, answer: make(chan error, 1)}
	queued, err := p.submit(ctx, o, o.answer)
	if queued && err != nil && ctx.Err() != nil {
		// The caller left while the claim was being recorded: give back
		// what it leased rather than let the leases run out.
		go func() {
			if <-o.answer == nil && len(o.got) > 0 {
				r.giveBack(p, ns, o.got)
			}
		}()
	}
	if isNotOwner(err) {
		return nil, nil
	}
	return o.got, err
}

// fillPayloads reads from the view, in one query, the payloads the
// partition let go of the claimed tasks (engine.Limits).
func (r *Replica) fillPayloads(ctx context.Context, got []engine.Claimed) error {
	var ids []uuid.UUID
	for _, c := range got {
		if c.Task.PayloadOut {
			ids = append(ids, c.Task.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	payloads, err := view.Payloads(ctx, r.pool, ids)
	if err != nil {
		return errUnavailable(err)
	}
	for _, c := range got {
		t := c.Task
		if !t.PayloadOut {
			continue
		}
		p, ok := payloads[t.ID]
		if !ok {
			// The partition lets a payload go only once the view has it.
			return fmt.Errorf("payload of task %s is not in the view", t.ID)
		}
		t.Payload, t.PayloadOut = p, false
	}
	return nil
}

// withPayload is t with its payload read from the view if the partition
// let it go.
func (r *Replica) withPayload(ctx context.Context, t engine.Task) (engine.Task, error) {
	err := r.fillPayloads(ctx, []engine.Claimed{{Task: &t}})
	return t, err
}

// giveBackAll abandons claimed tasks of any partitions nobody received.
func (r *Replica) giveBackAll(ns string, got []engine.Claimed) {
	byPart := map[int32][]engine.Claimed{}
	for _, c := range got {
		id := r.PartitionOf(c.Task.ID.String())
		byPart[id] = append(byPart[id], c)
	}
	for id, cs := range byPart {
		if p := r.part(id); p != nil {
			r.giveBack(p, ns, cs)
		}
	}
}

// giveBack abandons claimed tasks nobody received.
func (r *Replica) giveBack(p *partition, ns string, got []engine.Claimed) {
	reports := make([]engine.Report, len(got))
	for i, c := range got {
		reports[i] = engine.Report{TaskID: c.Task.ID.String(), Attempt: c.Task.Attempt, Kind: engine.Abandon}
	}
	o := &reportOp{ns: ns, reports: reports, answer: make(chan error, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), stopWait)
	defer cancel()
	if _, err := p.submit(ctx, o, o.answer); err != nil {
		r.log.Warn("giving back unclaimed tasks failed; their leases will run out", "tasks", len(got), "error", err)
	}
}

type claimOp struct {
	ns      string
	actions []string
	slots   []engine.Slot
	// floor is the lowest priority the claim's share-out asked the
	// partition for.
	floor  int32
	got    []engine.Claimed
	answer chan error
}

func (o *claimOp) apply(p *partition, now time.Time, changes []engine.Change) []engine.Change {
	// The claim was shared out on the levels the partition last published.
	// Tasks counted there may have gone since (to a waiting claim, or cold
	// once the view had them), and the slots left over would take lower
	// priorities than other partitions hold: the partition fills only as
	// many as it has tasks of the priorities it was asked for.
	slots := o.slots
	if n := p.eng.ReadyFrom(o.ns, o.actions, o.floor, now); n < len(slots) {
		slots = slots[:n]
	}
	var ch []engine.Change
	o.got, ch = p.eng.Claim(o.ns, o.actions, slots, now)
	return append(changes, ch...)
}

func (o *claimOp) done(err error) {
	if err != nil {
		o.got = nil
	}
	o.answer <- err
}

// Report applies reports about tasks of partitions this replica owns and
// returns the ids of those that matched no running attempt. Reports of
// partitions it does not own are rejected with ErrNotOwner as a whole. Every
// partition gets its reports before Report waits for any: a worker's slot
// comes back when its report is recorded, and waiting for one partition's
// commit after another made a call of eight partitions take eight commits.
func (r *Replica) Report(ctx context.Context, ns string, reports []engine.Report) ([]string, error) {
	if len(reports) == 0 {
		return nil, nil
	}
	if err := text.Name("namespace", ns); err != nil {
		return nil, err
	}
	// The reports are grouped by partition into one list: counted per
	// partition first, then each partition's call takes its share of it.
	ids := make([]int32, len(reports))
	slot := map[int32]int{} // a partition's count, then its call's index
	for i, rep := range reports {
		ids[i] = r.PartitionOf(rep.TaskID)
		slot[ids[i]]++
	}
	type call struct {
		p     *partition
		o     *reportOp
		spans []trace.Span
	}
	calls := make([]call, 0, len(slot))
	grouped := make([]engine.Report, len(reports))
	for id, n := range slot {
		p := r.part(id)
		if p == nil {
			return nil, ErrNotOwner
		}
		slot[id] = len(calls)
		calls = append(calls, call{p: p, o: &reportOp{ns: ns, reports: grouped[:0:n], answer: make(chan error, 1)}})
		grouped = grouped[n:]
	}
	for i, rep := range reports {
		o := calls[slot[ids[i]]].o
		o.reports = append(o.reports, rep)
	}
	// After a partition refuses its reports (it stopped, ctx ended) no
	// other is given any; those given some already are waited for, and
	// the caller tries them all again.
	var failed error
	queued := make([]call, 0, len(calls))
	for _, c := range calls {
		c.spans = startReportSpans(ctx, c.o.reports)
		if failed = c.p.enqueue(ctx, c.o); failed != nil {
			endReportSpans(c.spans, nil, failed)
			break
		}
		queued = append(queued, c)
	}
	var rejected []string
	for _, c := range queued {
		err := await(ctx, c.o.answer)
		endReportSpans(c.spans, c.o.ok, err)
		if err != nil {
			failed = cmp.Or(failed, err)
			continue
		}
		for i, ok := range c.o.ok {
			if !ok {
				rejected = append(rejected, c.o.reports[i].TaskID)
			}
		}
	}
	if failed != nil {
		return nil, failed
	}
	r.metrics.stale.Add(ctx, int64(len(rejected)))
	return rejected, nil
}

type reportOp struct {
	ns      string
	reports []engine.Report
	ok      []bool
	answer  chan error
}

func (o *reportOp) apply(p *partition, now time.Time, changes []engine.Change) []engine.Change {
	o.ok = make([]bool, len(o.reports))
	for i, rep := range o.reports {
		o.ok[i], changes = p.eng.Report(changes, o.ns, rep, now)
	}
	return changes
}

func (o *reportOp) done(err error) { o.answer <- err }

// Touch extends the lease of a running attempt.
func (r *Replica) Touch(ctx context.Context, ns, taskID string, attempt int32, extend time.Duration) (time.Time, error) {
	id, p, err := r.locate(ctx, ns, taskID)
	if err != nil {
		return time.Time{}, err
	}
	o := &touchOp{ns: ns, id: id, attempt: attempt, extend: extend, answer: make(chan error, 1)}
	if _, err := p.submit(ctx, o, o.answer); err != nil {
		return time.Time{}, err
	}
	return o.until, o.err
}

type touchOp struct {
	ns      string
	id      uuid.UUID
	attempt int32
	extend  time.Duration
	until   time.Time
	err     error
	answer  chan error
}

func (o *touchOp) apply(p *partition, now time.Time, changes []engine.Change) []engine.Change {
	var ch []engine.Change
	o.until, ch, o.err = p.eng.Touch(o.ns, o.id, o.attempt, o.extend, now)
	return append(changes, ch...)
}

func (o *touchOp) done(err error) { o.answer <- err }

// Finish ends a running or waiting attempt by its completion token.
func (r *Replica) Finish(ctx context.Context, ns, token string, f engine.Finish) (store.Task, error) {
	if err := text.Name("namespace", ns); err != nil {
		return store.Task{}, err
	}
	tok, err := engine.ParseToken(token)
	if err != nil {
		return store.Task{}, err
	}
	p := r.part(r.PartitionOf(tok.ID.String()))
	if p == nil {
		return store.Task{}, ErrNotOwner
	}
	o := &finishOp{ns: ns, tok: tok, f: f, answer: make(chan error, 1)}
	for tries := 0; ; tries++ {
		if _, err := p.submit(ctx, o, o.answer); err != nil {
			return store.Task{}, err
		}
		// A task finished a while ago is only in the view; with it loaded
		// the answer says why the token finishes nothing (or finishes it,
		// had it moved there meanwhile).
		again := o.err != nil && !o.held && (o.load == nil || errors.Is(o.err, errStaleView))
		if !again || tries == 3 {
			break
		}
		t, viewed, err := view.Load(ctx, r.pool, ns, tok.ID)
		if errors.Is(err, pg.ErrNotFound) {
			break
		}
		if err != nil {
			return store.Task{}, err
		}
		o = &finishOp{ns: ns, tok: tok, f: f, load: &viewRow{t, viewed}, answer: make(chan error, 1)}
	}
	if o.err != nil {
		return store.Task{}, o.err
	}
	t, err := r.withPayload(ctx, o.task)
	if err != nil {
		return store.Task{}, err
	}
	return t.Row(), nil
}

type finishOp struct {
	ns  string
	tok engine.Token
	f   engine.Finish
	// load, when set, is the task as the view has it, held first if the
	// partition does not hold it; held says whether it did.
	load   *viewRow
	held   bool
	task   engine.Task
	err    error
	answer chan error
}

func (o *finishOp) apply(p *partition, now time.Time, changes []engine.Change) []engine.Change {
	o.held = p.eng.Has(o.tok.ID)
	if o.load != nil && !o.held {
		if !p.current(o.load) {
			o.err = errStaleView
			return changes
		}
		p.eng.Load(o.load.task)
	}
	var ch []engine.Change
	o.task, ch, o.err = p.eng.Finish(o.ns, o.tok, o.f, now)
	return append(changes, ch...)
}

func (o *finishOp) done(err error) { o.answer <- err }

// Requeue queues a dead-lettered task again. A dead letter the partition
// no longer holds, or holds without its payload (which the Requeued record
// carries), is loaded from the view first.
func (r *Replica) Requeue(ctx context.Context, ns, taskID string) (store.Task, error) {
	id, p, err := r.locate(ctx, ns, taskID)
	if err != nil {
		return store.Task{}, err
	}
	var load *viewRow
	for tries := 0; ; tries++ {
		o := &requeueOp{ns: ns, id: id, load: load, answer: make(chan error, 1)}
		if _, err := p.submit(ctx, o, o.answer); err != nil {
			return store.Task{}, err
		}
		// The view is read when the partition let the task (or its
		// payload) go, and again when what was read turned out older than
		// the state the partition had let go.
		again := o.err != nil && !o.held || errors.Is(o.err, engine.ErrPayloadOut) || errors.Is(o.err, errStaleView)
		if !again || tries == 3 {
			if o.err != nil {
				return store.Task{}, o.err
			}
			return o.task.Row(), nil
		}
		t, viewed, err := view.Load(ctx, r.pool, ns, id)
		if errors.Is(err, pg.ErrNotFound) {
			return store.Task{}, notFoundTask(ns, taskID)
		}
		if err != nil {
			return store.Task{}, err
		}
		load = &viewRow{t, viewed}
	}
}

// errStaleView says a task read from the view may be older than the state
// the partition had let go (the view had it by then, the read came before):
// the caller reads the view again.
var errStaleView = errors.New("the view was read before it had the task's last state")

// viewRow is a task as view.Load read it, with the last events offset the
// view held then.
type viewRow struct {
	task   engine.Task
	viewed int64
}

// current says whether row is the last state of a task the partition does
// not hold. A task is let go (final, or cold) only once the view has its
// last state, so a row read when the view held every offset the partition
// knew it to hold is that state: the offset its materializer last reported,
// and at least the one its rebuild's snapshot had (a row read before the
// partition moved here may be older).
func (p *partition) current(row *viewRow) bool {
	return row.viewed >= max(p.materialized.Load(), p.snapshotViewed)
}

type requeueOp struct {
	ns string
	id uuid.UUID
	// load, when set, is the task as the view has it: held first if the
	// partition does not hold it, or its payload taken if it holds it
	// without; held says whether the partition held it.
	load   *viewRow
	held   bool
	task   engine.Task
	err    error
	answer chan error
}

func (o *requeueOp) apply(p *partition, now time.Time, changes []engine.Change) []engine.Change {
	o.held = p.eng.Has(o.id)
	if o.load != nil {
		// Holding a row older than the state the partition let go would
		// bring back a state the log has moved past.
		if !o.held && !p.current(o.load) {
			o.err = errStaleView
			return changes
		}
		p.eng.Load(o.load.task)
	}
	var ch []engine.Change
	o.task, ch, o.err = p.eng.Requeue(o.ns, o.id, now)
	return append(changes, ch...)
}

func (o *requeueOp) done(err error) { o.answer <- err }

// Get reads a task: from the partition while it holds it (live tasks, and
// final ones until the view has them), else from the view. An id neither
// knows may be an invocation still on its way, so the read first waits for
// the partition to apply the commands the log holds now.
func (r *Replica) Get(ctx context.Context, ns, taskID string) (store.Task, error) {
	id, p, err := r.locate(ctx, ns, taskID)
	if err != nil {
		return store.Task{}, err
	}
	for waited := false; ; waited = true {
		t, held, err := r.getHeld(ctx, p, ns, id)
		if err != nil {
			return store.Task{}, err
		}
		if held {
			if t, err = r.withPayload(ctx, t); err != nil {
				return store.Task{}, err
			}
			return t.Row(), nil
		}
		vt, _, err := view.Load(ctx, r.pool, ns, id)
		if err == nil {
			return vt.Row(), nil
		}
		if !errors.Is(err, pg.ErrNotFound) {
			return store.Task{}, err
		}
		if waited {
			return store.Task{}, notFoundTask(ns, taskID)
		}
		if err := r.awaitCommands(ctx, p); err != nil {
			return store.Task{}, err
		}
	}
}

// commandsEnd is the end offset of a commands partition now.
func (r *Replica) commandsEnd(ctx context.Context, id int32) (int64, error) {
	ends, err := kadm.NewClient(r.admin).ListEndOffsets(ctx, kafka.CommandsTopic)
	if err != nil {
		return 0, fmt.Errorf("list commands end offsets: %w", err)
	}
	end, ok := ends.Lookup(kafka.CommandsTopic, id)
	if !ok || end.Err != nil {
		return 0, fmt.Errorf("end offset of %s/%d: %v", kafka.CommandsTopic, id, end.Err)
	}
	return end.Offset, nil
}

// awaitCommands waits, up to unseenWait, until p applied every command the
// log holds for it now.
func (r *Replica) awaitCommands(ctx context.Context, p *partition) error {
	ctx, cancel := context.WithTimeout(ctx, unseenWait)
	defer cancel()
	end, err := r.commandsEnd(ctx, p.id)
	if err != nil {
		return err
	}
	if err := p.waitCommands(ctx, end); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// getHeld asks the partition for a task it holds, under the namespace.
func (r *Replica) getHeld(ctx context.Context, p *partition, ns string, id uuid.UUID) (engine.Task, bool, error) {
	o := &getOp{id: id, answer: make(chan error, 1)}
	if _, err := p.submit(ctx, o, o.answer); err != nil {
		return engine.Task{}, false, err
	}
	if !o.held || o.task.Namespace != ns {
		return engine.Task{}, false, nil
	}
	return o.task, true, nil
}

type getOp struct {
	id     uuid.UUID
	task   engine.Task
	held   bool
	answer chan error
}

func (o *getOp) apply(p *partition, _ time.Time, changes []engine.Change) []engine.Change {
	o.task, o.held = p.eng.Get(o.id)
	return changes
}

func (o *getOp) done(err error) { o.answer <- err }

// locate parses a task id of ns and finds its partition here.
func (r *Replica) locate(ctx context.Context, ns, taskID string) (uuid.UUID, *partition, error) {
	if err := r.cat.CheckNamespace(ctx, ns); err != nil {
		return uuid.UUID{}, nil, err
	}
	id, err := uuid.Parse(taskID)
	if err != nil {
		return uuid.UUID{}, nil, fault.Invalidf("task_id %q is not a UUID", taskID)
	}
	p := r.part(r.PartitionOf(taskID))
	if p == nil {
		return uuid.UUID{}, nil, ErrNotOwner
	}
	return id, p, nil
}

func notFoundTask(ns, taskID string) error {
	return fault.NotFoundf("task %s not found in namespace %s", taskID, ns)
}

// metrics are the owner's instruments.
type metrics struct {
	tasks         *taskevent.Counters
	stale         metric.Int64Counter
	rebuilds      metric.Int64Counter
	evicted       metric.Int64Counter
	invokeToStart metric.Float64Histogram
	claimPass     metric.Float64Histogram
	waiting       metric.Int64UpDownCounter
}

func (m *metrics) started(ctx context.Context, got []engine.Claimed) {
	now := time.Now()
	// A claim's tasks come from a few queues: each queue's attribute set is
	// made once, not once per task.
	type queue struct{ namespace, action string }
	sets := map[queue]metric.RecordOption{}
	for _, c := range got {
		q := queue{c.Task.Namespace, c.Task.Action}
		opt, ok := sets[q]
		if !ok {
			opt = metric.WithAttributeSet(attribute.NewSet(attribute.String("namespace", q.namespace), attribute.String("action", q.action)))
			sets[q] = opt
		}
		m.invokeToStart.Record(ctx, now.Sub(c.Task.CreatedAt).Seconds(), opt)
	}
}

func newMetrics(meter metric.Meter) (*metrics, error) {
	m := &metrics{}
	var err error
	if m.tasks, err = taskevent.NewCounters(meter); err != nil {
		return nil, err
	}
	if m.stale, err = meter.Int64Counter("flo.dispatcher.reports.stale", metric.WithUnit("{report}"),
		metric.WithDescription("Worker reports that matched no running attempt (its lease had expired, the task was final, the id was unknown) and changed nothing.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if m.rebuilds, err = meter.Int64Counter("flo.dispatcher.partition.rebuilds", metric.WithUnit("{rebuild}"),
		metric.WithDescription("Partitions this replica rebuilt from the view and the log: on taking a partition over, and after a failed transaction.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if m.evicted, err = meter.Int64Counter("flo.dispatcher.peers.evicted", metric.WithUnit("{replica}"),
		metric.WithDescription("Peer replicas this replica removed from the group because nothing listened at their address any more (killed without leaving), so their partitions moved before their session ran out.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if m.invokeToStart, err = meter.Float64Histogram("flo.tasks.invoke_to_start.duration", metric.WithUnit("s"),
		metric.WithDescription("From invocation to the attempt being handed to a worker.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if m.claimPass, err = meter.Float64Histogram("flo.tasks.claim.duration", metric.WithUnit("s"),
		metric.WithDescription("One pass of a claim: asking the owned partitions with ready tasks and recording the leases; waiting for work is not in it.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if m.waiting, err = meter.Int64UpDownCounter("flo.dispatcher.claims.waiting", metric.WithUnit("{claim}"),
		metric.WithDescription("Claims waiting at this replica for work to arrive; a gateway makes one per action set and lease, whatever the number of idle workers.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	return m, nil
}

// count adds a committed batch's changes to the flo.tasks.* counters.
func (m *metrics) count(ctx context.Context, changes []engine.Change) {
	type key struct {
		typ                       taskevent.Type
		namespace, action, reason string
	}
	n := map[key]int64{}
	for _, c := range changes {
		n[key{c.Type, c.Task.Namespace, c.Task.Action, c.Task.Outcome}]++
	}
	for k, v := range n {
		m.tasks.CountEvents(ctx, k.typ, k.namespace, k.action, k.reason, v)
	}
}
