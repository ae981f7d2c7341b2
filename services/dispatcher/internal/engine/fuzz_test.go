package engine_test

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// actions are the sim's actions, all of namespace ns.
var actions = []string{"a", "b"}

// sim drives a live partition with operations read from bytes, records each
// change through Encode and Decode, and replays it on a second partition,
// checking after each operation that the two hold the same tasks and that
// the live one's tasks are consistent. With limits, both let payloads go as
// the view catches up, and the sim plays the view for requeues.
type sim struct {
	t          *testing.T
	live, copy *engine.Partition
	limits     engine.Limits
	ids        []uuid.UUID
	now        time.Time
	offset     int64
	in         []byte
	// payloads are the tasks' payloads as the view has them; created and
	// last are each task's first and last records; materialized the offset
	// the view last reached.
	payloads      map[uuid.UUID][]byte
	created, last map[uuid.UUID]int64
	materialized  int64
	// view is each task's last state whole, for reading cold tasks back;
	// sawCold says some went cold.
	view    map[uuid.UUID]engine.Task
	sawCold bool
	// warm and warmCopy are a read of cold tasks under way in both, begun
	// at one catching up of the view and ended at the next; read is what
	// it found, the view as it was when it began.
	warm, warmCopy *engine.Warming
	read           []engine.Task
}

func newSim(t *testing.T, in []byte, limits engine.Limits) *sim {
	s := &sim{t: t, live: engine.New(1), copy: engine.New(1), limits: limits, now: t0, in: in,
		payloads: map[uuid.UUID][]byte{}, created: map[uuid.UUID]int64{}, last: map[uuid.UUID]int64{}, materialized: -1,
		view: map[uuid.UUID]engine.Task{}}
	s.live.SetLimits(limits)
	s.copy.SetLimits(limits)
	return s
}

// smallLimits make a sim's partitions let payloads go all the time: room for
// two of invocation's payloads, and delays beyond 2 s.
var smallLimits = engine.Limits{PayloadBytes: 16, Horizon: 2 * time.Second}

// coldLimits also let queued tasks past two go cold.
var coldLimits = engine.Limits{PayloadBytes: 16, Horizon: 2 * time.Second, QueuedTasks: 2}

// next is the next input byte, zero once they run out.
func (s *sim) next() int {
	if len(s.in) == 0 {
		return 0
	}
	b := s.in[0]
	s.in = s.in[1:]
	return int(b)
}

// pick is one of the tasks invoked so far (maybe evicted).
func (s *sim) pick() uuid.UUID {
	if len(s.ids) == 0 {
		return uuid.New()
	}
	return s.ids[s.next()%len(s.ids)]
}

func (s *sim) record(changes []engine.Change) {
	t := s.t
	// The stamp is the batch's: the commands consumed when it was made.
	stamp := s.offset
	recs, _, err := engine.EncodeAll(changes, 1, stamp)
	require.NoError(t, err)
	// The live partition takes the batch's offsets as the owner gives them,
	// the copy one by one as a rebuild does.
	offsets := make([]int64, len(changes))
	for i := range offsets {
		offsets[i] = s.offset + int64(i)
	}
	s.live.RecordedAll(changes, offsets)
	for i, c := range changes {
		got, cmd, err := engine.Decode(recs[i])
		require.NoError(t, err)
		require.Equal(t, stamp, cmd)
		s.copy.Apply(got)
		s.copy.Recorded(c.Task.ID, s.offset)
		s.last[c.Task.ID] = s.offset
		v := c.Task
		v.Payload, v.PayloadOut = s.payloads[c.Task.ID], false
		s.view[c.Task.ID] = v
		if _, ok := s.created[c.Task.ID]; !ok {
			s.created[c.Task.ID] = s.offset
		}
		s.offset++
	}
}

func (s *sim) run() {
	for len(s.in) > 0 {
		s.step()
		s.check()
	}
	s.finish()
	s.drain()
}

func (s *sim) step() {
	t, p := s.t, s.live
	switch s.next() % 10 {
	case 0: // invoke
		inv := invocation(actions[s.next()%2], int32(s.next()%3))
		inv.RunAt = s.now.Add(time.Duration(s.next()%4) * time.Second)
		set := &store.Settings{
			Timeout: time.Duration(1+s.next()%4) * time.Second, MaxAttempts: int32(1 + s.next()%3),
			Backoff: backoff.Policy{Kind: backoff.Exponential, Initial: 500 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2},
		}
		if s.next()%8 == 0 {
			set = nil
		}
		inv.InvokedAt = s.now
		changes := p.Invoke(nil, inv, set, "", s.now)
		require.Len(t, changes, 1)
		if set != nil {
			s.ids = append(s.ids, inv.TaskID)
			s.payloads[inv.TaskID] = inv.Payload
		}
		s.record(changes)
	case 1: // redelivery
		id := s.pick()
		if !p.Has(id) {
			return
		}
		before, _ := p.Get(id)
		require.Empty(t, p.Invoke(nil, engine.Invocation{TaskID: id, Namespace: ns, Action: "a"}, settings(3), "", s.now))
		after, _ := p.Get(id)
		require.Equal(t, before, after)
	case 2: // claim
		var slots []engine.Slot
		for i := range 1 + s.next()%3 {
			slots = append(slots, engine.Slot{WorkerID: "w", Lease: time.Duration(i%2) * 1500 * time.Millisecond})
		}
		claimed, changes := p.Claim(ns, actions[:1+s.next()%2], slots, s.now)
		require.Len(t, changes, len(claimed))
		s.record(changes)
	case 3: // report
		id := s.pick()
		task, _ := p.Get(id)
		attempt := task.Attempt + int32(s.next()%4/3) // now and then a stale one
		flags := s.next()
		r := engine.Report{
			TaskID: id.String(), Attempt: attempt, Kind: engine.Kind(flags % 6), Error: "e",
			Retry: flags&8 != 0, NonRetryable: flags&16 != 0, TimedOut: flags&32 != 0,
			Delay: time.Duration(s.next()%3) * time.Second,
		}
		ok, changes := p.Report(nil, ns, r, s.now)
		require.Equal(t, ok, len(changes) > 0)
		if !ok {
			after, _ := p.Get(id)
			require.Equal(t, task, after, "a stale report changes nothing")
		}
		s.record(changes)
	case 4: // tick
		s.now = s.now.Add(time.Duration(s.next()*20) * time.Millisecond)
		s.record(p.Tick(s.now))
	case 5: // touch
		id := s.pick()
		task, _ := p.Get(id)
		_, changes, err := p.Touch(ns, id, task.Attempt, time.Duration(s.next()%3)*time.Second, s.now)
		require.Equal(t, err == nil, task.Status == store.Running)
		s.record(changes)
	case 6: // finish by token
		id := s.pick()
		task, _ := p.Get(id)
		f := engine.Finish{Failed: s.next()%2 == 0, Result: []byte("r"), Error: "f"}
		_, changes, err := p.Finish(ns, engine.Token{ID: id, Attempt: task.Attempt, Secret: task.CompletionSecret}, f, s.now)
		require.Equal(t, err == nil, task.Status == store.Running || task.Status == store.Waiting)
		s.record(changes)
	case 7: // requeue
		id := s.pick()
		task, held := p.Get(id)
		_, changes, err := p.Requeue(ns, id, s.now)
		if errors.Is(err, engine.ErrPayloadOut) {
			require.True(t, task.PayloadOut)
			// As the owner does: the task as the view has it gives the
			// payload back.
			task.Payload, task.PayloadOut = s.payloads[id], false
			p.Load(task)
			_, changes, err = p.Requeue(ns, id, s.now)
		}
		require.Equal(t, err == nil, held && task.Status == store.DeadLettered)
		for _, c := range changes {
			require.Equal(t, s.payloads[id], c.Task.Payload, "a requeue records the payload")
		}
		s.record(changes)
	case 8: // the view catches up
		off := s.offset - 1 - int64(s.next()%8)
		p.Materialized(off)
		s.copy.Materialized(off)
		s.materialized = max(s.materialized, off)
		s.checkBound()
		// Cold tasks are read back as the queue drains, alike in both; the
		// partitions go on while the read is under way.
		if s.warm != nil {
			require.Equal(t, p.Warmed(s.warm, s.read), s.copy.Warmed(s.warmCopy, s.read))
			s.warm, s.warmCopy = nil, nil
			break
		}
		w, wc := p.Warm(), s.copy.Warm()
		require.Equal(t, w == nil, wc == nil)
		if w != nil {
			require.Equal(t, w.N, wc.N)
			require.Equal(t, [2]string{w.Namespace, w.Action}, [2]string{wc.Namespace, wc.Action})
			require.ElementsMatch(t, w.Held, wc.Held)
			s.warm, s.warmCopy, s.read = w, wc, readCold(s.view, w)
		}
	default:
		s.now = s.now.Add(time.Duration(s.next()*10) * time.Millisecond)
	}
}

// check holds after every operation.
func (s *sim) check() {
	t := s.t
	ready := map[string]int{}
	levels := map[string]map[int32]int{}
	for _, a := range actions {
		levels[a] = map[int32]int{}
	}
	var held int64
	for _, id := range s.ids {
		task, ok := s.live.Get(id)
		_, copyHeld := s.copy.Get(id)
		require.Equal(t, ok, copyHeld, "both hold %s or neither", id)
		require.Equal(t, s.live.Has(id), s.copy.Has(id), "both know %s or neither", id)
		if !ok {
			continue
		}
		// reflect first: require.Equal on every task after every step
		// would make long inputs crawl.
		if replayed, _ := s.copy.Get(id); !reflect.DeepEqual(normal(task), normal(replayed)) {
			require.Equal(t, normal(task), normal(replayed), "replay of %s", id)
		}
		require.GreaterOrEqual(t, task.Attempt, int32(0))
		require.LessOrEqual(t, task.Attempt, task.Settings.MaxAttempts, "attempts never exceed the max")
		require.Equal(t, task.Status == store.Running, !task.LeaseUntil.IsZero(), "a lease only while running: %+v", task)
		require.Equal(t, task.Status == store.Waiting, !task.CompleteBy.IsZero(), "a deadline only while waiting")
		require.Equal(t, task.Final(), !task.FinishedAt.IsZero(), "finished only when final")
		if task.PayloadOut {
			require.Empty(t, task.Payload)
			require.LessOrEqual(t, s.created[id], s.materialized, "a payload goes only once the view has it")
		} else {
			require.Equal(t, s.payloads[id], task.Payload)
			held += int64(len(task.Payload))
		}
		switch task.Status {
		case store.Running, store.Waiting:
			require.GreaterOrEqual(t, task.Attempt, int32(1))
			require.Len(t, task.CompletionSecret, 16)
		case store.Queued:
			if !task.RunAt.After(s.now) {
				ready[task.Action]++
				levels[task.Action][task.Priority]++
			}
		case store.Completed, store.Failed, store.DeadLettered:
		default:
			t.Fatalf("task %s has state %q", id, task.Status)
		}
	}
	for _, a := range actions {
		require.Equal(t, ready[a], s.live.Ready(ns, a, s.now), "ready %s", a)
		require.Equal(t, ready[a], s.copy.Ready(ns, a, s.now), "replayed ready %s", a)
		var want []engine.Level
		for prio := int32(2); prio >= 0; prio-- {
			if n := levels[a][prio]; n > 0 {
				want = append(want, engine.Level{Priority: prio, Count: n})
			}
		}
		require.Equal(t, want, s.live.ReadyLevels(ns, a, s.now), "ready levels %s", a)
		require.Equal(t, want, s.copy.ReadyLevels(ns, a, s.now), "replayed ready levels %s", a)
	}
	require.Equal(t, s.live.Len(), s.copy.Len())
	require.Equal(t, s.live.Cold(), s.copy.Cold())
	s.sawCold = s.sawCold || s.live.Cold() > 0
	// No task is lost: every queued task the partition does not hold is
	// counted cold in its queue, so that it is read back.
	cold := map[string]int{}
	for id, task := range s.view {
		if task.Status == store.Queued && !s.live.Has(id) {
			cold[task.Action]++
		}
	}
	sum := 0
	for _, a := range actions {
		require.LessOrEqual(t, cold[a], s.live.ColdIn(ns, a), "queued tasks of %s only the view has are counted cold", a)
		require.Equal(t, s.live.ColdIn(ns, a), s.copy.ColdIn(ns, a))
		sum += s.live.ColdIn(ns, a)
	}
	require.Equal(t, sum, s.live.Cold())
	require.Equal(t, held, s.live.PayloadBytes(), "payload bytes counted exactly")
	require.Equal(t, held, s.copy.PayloadBytes(), "replayed payload bytes counted exactly")
	require.True(t, s.live.NextDue().Equal(s.copy.NextDue()), "next due %v, replayed %v", s.live.NextDue(), s.copy.NextDue())
}

// checkBound checks, after the view caught up, that the payloads held are
// within the bound unless only payloads the view lacks remain, and that none
// of a queued task due beyond the horizon is held.
func (s *sim) checkBound() {
	t := s.t
	if s.limits == (engine.Limits{}) {
		return
	}
	var viewed int64
	for _, id := range s.ids {
		task, ok := s.live.Get(id)
		if !ok || task.PayloadOut || s.last[id] > s.materialized {
			continue
		}
		viewed += int64(len(task.Payload))
		if task.Status == store.Queued {
			require.False(t, task.RunAt.After(s.now.Add(s.limits.Horizon)), "payload of %s due at %v held at %v", id, task.RunAt, s.now)
		}
	}
	require.True(t, viewed == 0 || s.live.PayloadBytes() <= s.limits.PayloadBytes,
		"%d bytes held, %d of them in the view, bound %d", s.live.PayloadBytes(), viewed, s.limits.PayloadBytes)
}

// finish rebuilds a third partition from the live tasks as the view would
// have them, then checks that all three hand out the same tasks in the same
// order and expire the same leases.
func (s *sim) finish() {
	t := s.t
	loaded := engine.New(1)
	for _, id := range s.ids {
		if task, ok := s.live.Get(id); ok {
			loaded.Load(task)
		}
	}
	end := s.now.Add(time.Hour)
	slots := make([]engine.Slot, len(s.ids)+1)
	var (
		order [][]uuid.UUID
		due   []time.Time
	)
	for _, p := range []*engine.Partition{s.live, s.copy, loaded} {
		var ids []uuid.UUID
		for _, c := range p.Tick(end) {
			ids = append(ids, c.Task.ID)
		}
		due = append(due, p.NextDue().UTC())
		claimed, _ := p.Claim(ns, actions, slots, end)
		for _, c := range claimed {
			ids = append(ids, c.Task.ID)
		}
		order = append(order, ids)
	}
	require.Equal(t, order[0], order[1], "replayed")
	require.Equal(t, order[0], order[2], "loaded")
	require.Equal(t, due[0], due[1], "replayed")
	require.Equal(t, due[0], due[2], "loaded")
}

// drain hands out, after finish, every task the view has queued that the
// live partition does not hold: first those of actions[0] alone, as if
// nobody worked the other action, then all. The partition reads its cold
// tasks back until none is left, so no queued task stays in the view for
// good, and an action nobody works keeps no other's there.
func (s *sim) drain() {
	t, p := s.t, s.live
	if s.warm != nil {
		p.Warmed(s.warm, s.read)
	}
	left := func(of []string) int {
		n := 0
		for id, task := range s.view {
			if task.Status == store.Queued && !p.Has(id) && slices.Contains(of, task.Action) {
				n++
			}
		}
		return n
	}
	at := s.now.Add(2 * time.Hour)
	slots := make([]engine.Slot, len(s.ids)+1)
	for _, of := range [][]string{actions[:1], actions} {
		for range 4*len(s.ids) + 4 {
			if left(of) == 0 {
				break
			}
			// A queue whose own read found too few waits a second to read
			// again.
			at = at.Add(2 * time.Second)
			p.Claim(ns, of, slots, at)
			if w := p.Warm(); w != nil {
				p.Warmed(w, readCold(s.view, w))
			}
		}
		require.Zero(t, left(of), "queued tasks of %v left in the view", of)
	}
	for range 4 {
		if w := p.Warm(); w != nil {
			p.Warmed(w, readCold(s.view, w))
		}
	}
	require.Zero(t, p.Cold(), "cold tasks counted")
}

func TestReplay(t *testing.T) {
	t.Parallel()
	// invoke ×6, claim, report each kind, touch, tick past leases, finish,
	// requeue, materialize.
	ops := []byte{
		0, 0, 0, 1, 3, 0, 0, 1, 0, 1, 2, 2, 1, 0, 0, 1, 1, 0, 2, 0, 0, 0,
		0, 1, 1, 0, 0, 0, 2, 5, 1, 0, 0, 0, 2, 2, 1, 0,
		2, 3, 1, 2, 9, 0, 2, 3, 1, 0, 1, 1, 3, 2, 0, 12, 0, 3, 3, 0, 20, 1, 3, 4, 0, 5, 0,
		5, 1, 2, 6, 2, 1, 4, 200, 2, 3, 2, 3, 0, 3, 0, 6, 5, 1, 4, 250, 7, 0, 7, 1, 7, 2,
		3, 3, 0, 0, 0, 8, 3, 9, 100, 2, 3, 0, 2, 3, 3, 0, 1, 0, 4, 250, 4, 250, 8, 0, 1, 2,
	}
	for _, limits := range []engine.Limits{{}, smallLimits, coldLimits} {
		s := newSim(t, ops, limits)
		s.run()
		require.NotZero(t, s.offset)
		require.Equal(t, limits.QueuedTasks > 0, s.sawCold, "tasks went cold with %+v", limits)
	}
}

func FuzzPartition(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 3, 0, 0, 2, 1, 0, 3, 0, 0, 1, 0, 4, 255, 2, 1, 0})
	f.Add([]byte{0, 1, 2, 0, 0, 1, 1, 0, 2, 1, 0, 3, 0, 0, 4, 3, 0, 0, 7, 0, 8, 0})
	f.Add([]byte{0, 0, 0, 0, 1, 2, 0, 2, 0, 1, 5, 0, 0, 3, 0, 0, 4, 2, 6, 0, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 256 { // longer inputs find no more and make minimizing slow
			return
		}
		newSim(t, ops, engine.Limits{}).run()
		newSim(t, ops, smallLimits).run()
		newSim(t, ops, coldLimits).run()
	})
}

// TestSimRejects keeps the sim honest: rejected invocations are recorded and
// replayed without creating a task.
func TestSimRejects(t *testing.T) {
	t.Parallel()
	s := newSim(t, nil, engine.Limits{})
	s.record(s.live.Invoke(nil, invocation("gone", 0), nil, "", t0))
	require.Equal(t, int64(1), s.offset)
	require.Zero(t, s.copy.Len())
	require.Equal(t, taskevent.Rejected, func() taskevent.Type {
		c := s.live.Invoke(nil, invocation("gone", 0), settings(1), engine.RejectDisabled, t0)
		return c[0].Type
	}())
}
