package engine_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// Past Limits.QueuedTasks the queued tasks last in hand-out order go cold
// once the view has them: the partition keeps nothing of them but their
// count. They are not claimed; once the partition holds half the bound or
// less it reads the next ones back from the view, in hand-out order.
func TestQueuedTasksPastTheBoundGoColdAndComeBackInOrder(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	p.SetLimits(engine.Limits{QueuedTasks: 10})
	view := map[uuid.UUID]engine.Task{}
	var order []uuid.UUID // hand-out order: priority, then creation
	byPrio := map[int32][]uuid.UUID{}
	var unviewed []uuid.UUID
	for i := range 30 {
		inv := invocation("a", int32(i%3))
		inv.InvokedAt = at(time.Duration(i) * time.Millisecond)
		changes := p.Invoke(nil, inv, settings(3), "", at(time.Second))
		require.Len(t, changes, 1)
		p.Recorded(inv.TaskID, int64(i))
		view[inv.TaskID] = changes[0].Task
		byPrio[inv.Priority] = append(byPrio[inv.Priority], inv.TaskID)
		if i >= 28 {
			unviewed = append(unviewed, inv.TaskID)
		}
	}
	for _, prio := range []int32{2, 1, 0} {
		order = append(order, byPrio[prio]...)
	}
	require.Equal(t, 30, p.Queued())
	p.Materialized(27) // the last two are not in the view yet
	require.Equal(t, 9, p.Queued(), "down to nine tenths of the bound")
	require.Equal(t, 21, p.Cold())
	for _, id := range unviewed {
		_, held := p.Get(id)
		require.True(t, held, "a task the view lacks stays whole")
	}
	// The rest held are the first in hand-out order of those the view has.
	viewed := slices.DeleteFunc(slices.Clone(order), func(id uuid.UUID) bool { return slices.Contains(unviewed, id) })
	for _, id := range viewed[:7] {
		_, held := p.Get(id)
		require.True(t, held, "the first in hand-out order stay")
	}
	require.False(t, p.Has(order[20]), "a cold task is not held")
	require.Nil(t, p.Warm(), "no read back while the partition holds more than half the bound")

	claimed, _ := p.Claim(ns, []string{"a"}, make([]engine.Slot, 5), at(2*time.Second))
	require.Len(t, claimed, 5)
	require.Equal(t, 4, p.Queued())
	w := p.Warm()
	require.NotNil(t, w)
	require.Equal(t, 5, w.N, "back to nine tenths of the bound")
	require.Len(t, w.Held, 9, "the held tasks' rows are left out")
	require.Nil(t, p.Warm(), "one read at a time")
	require.Equal(t, 21, p.Cold(), "cold until read")

	// A read that failed is begun again.
	p.Unwarm(w)
	w = p.Warm()
	require.NotNil(t, w)
	read := readCold(view, w)
	require.Len(t, read, 5)
	require.Equal(t, 5, p.Warmed(w, read))
	require.Equal(t, 9, p.Queued())
	require.Equal(t, 16, p.Cold())

	// What is held comes out in hand-out order, the cold ones after.
	var got []uuid.UUID
	for _, c := range claimed {
		got = append(got, c.Task.ID)
	}
	for p.Queued() > 0 || p.Cold() > 0 {
		if w := p.Warm(); w != nil {
			p.Warmed(w, readCold(view, w))
		}
		claimed, _ := p.Claim(ns, []string{"a"}, make([]engine.Slot, 3), at(3*time.Second))
		require.NotEmpty(t, claimed)
		for _, c := range claimed {
			got = append(got, c.Task.ID)
		}
	}
	require.Len(t, got, 30)
	// The two the view lacked stayed held and went out among the first.
	require.Equal(t, viewed, slices.DeleteFunc(got, func(id uuid.UUID) bool { return slices.Contains(unviewed, id) }))
}

// A task the view holds that the log says moved on (a rebuild, which left
// it in the view, replays a later record) is held again, its payload left
// in the view; the counts are the rebuild's to set after its replay (the
// view's snapshot says which of those were cold). A cold task a call loads
// from its row (a completion by token) comes off its queue's count.
func TestAColdTaskHeldAgainLeavesItsQueuesCount(t *testing.T) {
	t.Parallel()
	task := func() engine.Task { return engine.New(0).Invoke(nil, invocation("a", 0), settings(3), "", t0)[0].Task }
	p := engine.New(0)
	p.SetLimits(engine.Limits{QueuedTasks: 2})
	p.SetCold(ns, "a", 3, time.Time{}, time.Time{})

	started := task()
	started.Status, started.Attempt, started.WorkerID, started.Payload = store.Running, 1, "w1", nil
	started.LeaseUntil = at(time.Minute)
	p.Apply(engine.Change{Type: taskevent.Started, Task: started})
	got := get(t, p, started.ID)
	require.Equal(t, store.Running, got.Status)
	require.True(t, got.PayloadOut, "the payload is read from the view when needed")
	require.Equal(t, 3, p.Cold(), "a replayed record may be of a task the view had final")

	requeued := task()
	requeued.Payload = []byte(`{"n":1}`)
	p.Apply(engine.Change{Type: taskevent.Requeued, Task: requeued})
	require.Equal(t, 3, p.Cold())
	p.SetCold(ns, "a", 2, time.Time{}, time.Time{})
	require.Equal(t, 2, p.Cold())

	p.Load(task())
	require.Equal(t, 1, p.Cold(), "a queued row loaded was cold")
	running := task()
	running.Status = store.Running
	p.Load(running)
	require.Equal(t, 1, p.Cold(), "a running row was not")
}

// A read back brings back only tasks still cold when it comes: not one the
// partition let go meanwhile (its row may be from before its last state),
// nor one it holds. Tasks going cold meanwhile keep the count.
func TestReadBackTakesOnlyTasksStillCold(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	p.SetLimits(engine.Limits{QueuedTasks: 10})
	view := map[uuid.UUID]engine.Task{}
	offset := int64(0)
	record := func(changes []engine.Change) {
		for _, c := range changes {
			p.Recorded(c.Task.ID, offset)
			view[c.Task.ID] = c.Task
			offset++
		}
	}
	for range 20 {
		record(p.Invoke(nil, invocation("a", 0), settings(1), "", t0))
	}
	p.Materialized(offset - 1)
	require.Equal(t, 9, p.Queued())
	require.Equal(t, 11, p.Cold())
	claimed, changes := p.Claim(ns, []string{"a"}, make([]engine.Slot, 6), at(time.Second))
	require.Len(t, claimed, 6)
	record(changes)
	w := p.Warm()
	require.NotNil(t, w)
	require.Equal(t, 6, w.N)
	// The read sees the view as it was: the claimed tasks still queued.
	stale := maps.Clone(view)
	for _, c := range claimed {
		queued := *c.Task
		queued.Status = store.Queued
		stale[c.Task.ID] = queued
	}
	// Meanwhile the first claimed task completes and is let go.
	done := claimed[0].Task
	_, changes, err := p.Finish(ns, engine.Token{ID: done.ID, Attempt: done.Attempt, Secret: done.CompletionSecret},
		engine.Finish{Result: []byte("r")}, at(2*time.Second))
	require.NoError(t, err)
	record(changes)
	p.Materialized(offset - 1)
	require.False(t, p.Has(done.ID))

	// A read that did not leave the one let go out, as for a task held only
	// after the read began.
	read := readCold(stale, &engine.Warming{N: w.N, Held: slices.DeleteFunc(slices.Clone(w.Held), func(id uuid.UUID) bool {
		return id == done.ID
	}), Now: w.Now})
	require.Equal(t, done.ID, read[0].ID, "the stale row comes first")
	require.Equal(t, 5, p.Warmed(w, read), "all but the task let go")
	require.False(t, p.Has(done.ID), "a completed task is not brought back")
	require.Equal(t, 6, p.Cold())

	// A read that finds fewer than asked while tasks went cold meanwhile
	// keeps counting them.
	claimed, changes = p.Claim(ns, []string{"a"}, make([]engine.Slot, 10), at(3*time.Second))
	require.Len(t, claimed, 8)
	record(changes)
	w = p.Warm()
	require.NotNil(t, w)
	for range 20 {
		record(p.Invoke(nil, invocation("a", 0), settings(1), "", at(3*time.Second)))
	}
	p.Materialized(offset - 1)
	require.Equal(t, 17, p.Cold(), "eleven more went cold")
	require.Zero(t, p.Warmed(w, nil))
	require.Equal(t, 17, p.Cold(), "a read that began before they went cold says nothing of them")
}

// coldQueues invokes tasks into a partition and records them, each change
// in the view at the next offset.
type coldQueues struct {
	p      *engine.Partition
	view   map[uuid.UUID]engine.Task
	offset int64
}

// invoke invokes n tasks of action, 1 ms apart from invoked on, due at
// runAt (zero: at once), and lets the view have them.
func (c *coldQueues) invoke(t *testing.T, action string, n int, invoked, runAt time.Time) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	for range n {
		inv := invocation(action, 0)
		inv.InvokedAt, inv.RunAt = invoked, runAt
		invoked = invoked.Add(time.Millisecond)
		changes := c.p.Invoke(nil, inv, settings(3), "", invoked)
		require.Len(t, changes, 1)
		c.p.Recorded(inv.TaskID, c.offset)
		c.offset++
		c.view[inv.TaskID] = changes[0].Task
		ids = append(ids, inv.TaskID)
	}
	c.p.Materialized(c.offset - 1)
	return ids
}

// A queue nobody claims from (an action without workers) fills the
// partition without keeping another queue's tasks in the view: past the
// bound the queue holding the most loses its tasks first, and a queue that
// runs low on ready tasks reads its own cold ones back while the other
// holds the partition.
func TestAQueueNobodyClaimsFromKeepsNoOtherInTheView(t *testing.T) {
	t.Parallel()
	c := &coldQueues{p: engine.New(0), view: map[uuid.UUID]engine.Task{}}
	c.p.SetLimits(engine.Limits{QueuedTasks: 100})
	c.invoke(t, "b", 300, at(0), time.Time{})
	require.Equal(t, 90, c.p.Queued())
	require.Equal(t, 210, c.p.ColdIn(ns, "b"))

	// Fewer than the bound, but together past it: b, holding more, loses
	// tasks until both hold as many.
	a := c.invoke(t, "a", 50, at(time.Second), time.Time{})
	require.Equal(t, 90, c.p.Queued())
	require.Equal(t, 45, c.p.Ready(ns, "a", at(2*time.Second)))
	require.Equal(t, 45, c.p.Ready(ns, "b", at(2*time.Second)))
	require.Equal(t, 5, c.p.ColdIn(ns, "a"), "the last of a went")
	require.Equal(t, 255, c.p.ColdIn(ns, "b"))

	var got []uuid.UUID
	reads := 0
	for range 20 {
		// Claims of a's tasks take the partition down to half the bound,
		// and it reads b's next tasks back; then a runs low and reads its
		// own.
		if w := c.p.Warm(); w != nil {
			if w.Action != "" {
				require.Equal(t, [2]string{ns, "a"}, [2]string{w.Namespace, w.Action}, "only a runs low")
				require.Equal(t, 10, w.N, "a tenth of the bound")
				reads++
			}
			c.p.Warmed(w, readCold(c.view, w))
		}
		claimed, _ := c.p.Claim(ns, []string{"a"}, make([]engine.Slot, 10), at(3*time.Second))
		for _, cl := range claimed {
			got = append(got, cl.Task.ID)
		}
	}
	require.Equal(t, a, got, "every task of a, in order, while b holds the partition")
	require.Equal(t, 1, reads)
	require.Zero(t, c.p.ColdIn(ns, "a"))
	require.Equal(t, 300, c.p.Ready(ns, "b", at(3*time.Second))+c.p.ColdIn(ns, "b"), "b's tasks are held or counted")
	require.Greater(t, c.p.Queued(), 50)
	require.Nil(t, c.p.Warm(), "b holds more than half the bound; a has no cold task")
}

// A queue whose own read finds no ready cold task while it has delayed
// ones reads again a second later, and its delayed tasks come back once
// they are due.
func TestAQueueReadsItsDelayedColdTasksOnceDue(t *testing.T) {
	t.Parallel()
	c := &coldQueues{p: engine.New(0), view: map[uuid.UUID]engine.Task{}}
	c.p.SetLimits(engine.Limits{QueuedTasks: 20})
	a := c.invoke(t, "a", 10, at(0), at(time.Minute))
	c.invoke(t, "b", 30, at(time.Second), time.Time{})
	require.Equal(t, 18, c.p.Queued())
	cold := c.p.ColdIn(ns, "a")
	require.Positive(t, cold, "a lost its latest due tasks")

	w := c.p.Warm()
	require.NotNil(t, w)
	require.Equal(t, "a", w.Action)
	require.Empty(t, readCold(c.view, w), "a's cold tasks are not due")
	require.Zero(t, c.p.Warmed(w, readCold(c.view, w)))
	require.Equal(t, cold, c.p.ColdIn(ns, "a"), "they are still counted")
	require.Nil(t, c.p.Warm(), "a waits a second before it reads again")

	var got []uuid.UUID
	for i := range 10 {
		now := at(time.Minute + time.Duration(i)*time.Second)
		if w := c.p.Warm(); w != nil {
			c.p.Warmed(w, readCold(c.view, w))
		}
		claimed, _ := c.p.Claim(ns, []string{"a"}, make([]engine.Slot, 10), now)
		for _, cl := range claimed {
			got = append(got, cl.Task.ID)
		}
	}
	require.ElementsMatch(t, a, got)
	require.Zero(t, c.p.ColdIn(ns, "a"))
}

// Under a backlog past the bound that keeps arriving as fast as it is
// worked, the tasks that go cold are the older ones (only tasks the view
// has go cold, and the view writes a live state late), yet they go out
// before the newer ones held: a queue reads its cold tasks back once the
// next task it would hand out comes after them. Without that they waited
// for as long as the backlog lasted.
func TestColdTasksGoOutBeforeNewerHeldOnes(t *testing.T) {
	t.Parallel()
	c := &coldQueues{p: engine.New(0), view: map[uuid.UUID]engine.Task{}}
	c.p.SetLimits(engine.Limits{QueuedTasks: 100})
	const (
		// step tasks go in and out per step, half of what the read of a
		// tenth of the bound brings back in one: a read takes less time than
		// a worker's turn (Session 17: 8,000 rows in 75-126 ms).
		step = 5
		lag  = 3 // steps the view trails the log by
	)
	now := at(0)
	var (
		invoked []uuid.UUID
		pending []int64 // each step's last offset, for the lagging view
	)
	add := func(n int) {
		for range n {
			inv := invocation("a", 0)
			inv.InvokedAt = now
			now = now.Add(time.Millisecond)
			changes := c.p.Invoke(nil, inv, settings(3), "", now)
			c.p.Recorded(inv.TaskID, c.offset)
			c.offset++
			c.view[inv.TaskID] = changes[0].Task
			invoked = append(invoked, inv.TaskID)
		}
		pending = append(pending, c.offset-1)
		if len(pending) > lag {
			c.p.Materialized(pending[0])
			pending = pending[1:]
		}
	}
	claimedAt := map[uuid.UUID]int{}
	for range 60 {
		add(step) // a backlog of 300 builds up first
	}
	for s := range 600 {
		add(step)
		if w := c.p.Warm(); w != nil {
			c.p.Warmed(w, readCold(c.view, w))
		}
		claimed, _ := c.p.Claim(ns, []string{"a"}, make([]engine.Slot, step), now)
		for _, cl := range claimed {
			claimedAt[cl.Task.ID] = s
		}
	}
	require.Positive(t, c.p.Cold(), "the backlog is still past the bound")
	// Every task invoked in the first half went out, in about the order it
	// came: none waited for the backlog to end.
	half := invoked[:len(invoked)/2]
	late := 0
	for i, id := range half {
		s, ok := claimedAt[id]
		require.True(t, ok, "task %d of %d never went out", i, len(invoked))
		// In order, task i would go out at step i/step; allow for the bound
		// and the view's lag.
		if s > i/step+(100+lag*step)/step {
			late++
		}
	}
	require.Zero(t, late, "tasks handed out far behind their turn")
}

// steadyBacklog runs a queue of action "a" whose backlog arrives as fast as
// it is worked: each step invokes step ready tasks 1 ms apart (the view has
// them at once), reads cold tasks back when the partition asks, and claims
// step tasks. It records the step each task went out at, and the order.
type steadyBacklog struct {
	*coldQueues
	now       time.Time
	claimedAt map[uuid.UUID]int
	out       []uuid.UUID
	steps     int
}

func (b *steadyBacklog) run(t *testing.T, steps, step int) {
	t.Helper()
	for range steps {
		b.invoke(t, "a", step, b.now, time.Time{})
		b.now = b.now.Add(time.Duration(step) * time.Millisecond)
		if w := b.p.Warm(); w != nil {
			b.p.Warmed(w, readCold(b.view, w))
		}
		claimed, _ := b.p.Claim(ns, []string{"a"}, make([]engine.Slot, step), b.now)
		for _, cl := range claimed {
			b.claimedAt[cl.Task.ID] = b.steps
			b.out = append(b.out, cl.Task.ID)
		}
		b.steps++
	}
}

// Delayed tasks that went cold come back once due, in their turn, while a
// steady backlog keeps their queue from running low, even when no ready
// task of the queue is cold to read from. Before, they came back only once
// the queue ran low, which such a backlog never lets it do.
func TestDelayedColdTasksComeBackOnceDueUnderASteadyBacklog(t *testing.T) {
	t.Parallel()
	b := &steadyBacklog{coldQueues: &coldQueues{p: engine.New(0), view: map[uuid.UUID]engine.Task{}}, claimedAt: map[uuid.UUID]int{}}
	b.p.SetLimits(engine.Limits{QueuedTasks: 100})
	due := at(time.Second)
	b.invoke(t, "a", 85, at(0), time.Time{})
	delayed := b.invoke(t, "a", 30, at(100*time.Millisecond), due)
	require.Equal(t, 25, b.p.ColdIn(ns, "a"), "only delayed ones went cold: no ready one to read from")
	b.now = at(200 * time.Millisecond)

	b.run(t, 400, 5) // 2 s at 5 tasks a step
	for _, id := range delayed {
		_, ok := b.claimedAt[id]
		require.True(t, ok, "a delayed cold task never came back")
	}
	// In hand-out order they come after the tasks invoked before they were
	// due and before those invoked after. A read brings a tenth of the bound
	// back once the next task held comes after where they begin, so the
	// claim that takes the last one read may take later ones too: at most
	// a claim's worth of later tasks per read (three reads of ten) goes
	// ahead of them.
	later, last := 0, 0
	for _, id := range b.out {
		if slices.Contains(delayed, id) {
			last = later
		} else if b.view[id].RunAt.After(due) {
			later++
		}
	}
	require.LessOrEqual(t, last, 3*5, "tasks invoked after the delayed ones were due went out ahead of them")
}

// A delayed task that went cold and comes due with a higher priority than
// where its queue's cold ready tasks begin goes out as soon as it is due,
// under a backlog past the bound that keeps arriving as fast as it is
// worked.
func TestAHigherPriorityDelayedColdTaskGoesOutOnceDue(t *testing.T) {
	t.Parallel()
	b := &steadyBacklog{coldQueues: &coldQueues{p: engine.New(0), view: map[uuid.UUID]engine.Task{}}, claimedAt: map[uuid.UUID]int{}}
	b.p.SetLimits(engine.Limits{QueuedTasks: 100})
	due := at(time.Second)
	inv := invocation("a", 5)
	inv.InvokedAt, inv.RunAt = at(0), due
	changes := b.p.Invoke(nil, inv, settings(3), "", at(0))
	b.p.Recorded(inv.TaskID, b.offset)
	b.offset++
	b.view[inv.TaskID] = changes[0].Task
	b.invoke(t, "a", 300, at(time.Millisecond), time.Time{}) // a backlog past the bound
	require.False(t, b.p.Has(inv.TaskID), "the delayed task went cold first")
	b.now = at(400 * time.Millisecond)

	b.run(t, 200, 5) // 1 s at 5 tasks a step
	require.Positive(t, b.p.ColdIn(ns, "a"), "the backlog is still past the bound")
	went, ok := b.claimedAt[inv.TaskID]
	require.True(t, ok, "the delayed task never went out")
	// Due at step 120 (400 ms on, 5 ms a step); the next claims hand it out.
	require.LessOrEqual(t, went, 122, "it waited behind lower priorities")
}
