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
		changes := p.Invoke(inv, settings(3), "", at(time.Second))
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

// A cold task that the log says moved on (a rebuild, which left it in the
// view, replays a later record) is held again, its payload left in the
// view; the count of cold tasks is corrected by the next read back.
func TestReplayedColdTaskIsHeldAgain(t *testing.T) {
	t.Parallel()
	inv := invocation("a", 0)
	task := engine.New(0).Invoke(inv, settings(3), "", t0)[0].Task
	p := engine.New(0)
	p.SetLimits(engine.Limits{QueuedTasks: 2})
	p.SetCold(1)
	started := task
	started.Status, started.Attempt, started.WorkerID, started.Payload = store.Running, 1, "w1", nil
	started.LeaseUntil = at(time.Minute)
	p.Apply(engine.Change{Type: taskevent.Started, Task: started})
	got := get(t, p, inv.TaskID)
	require.Equal(t, store.Running, got.Status)
	require.True(t, got.PayloadOut, "the payload is read from the view when needed")

	w := p.Warm()
	require.NotNil(t, w)
	// The view's row is still the queued one.
	require.Zero(t, p.Warmed(w, readCold(map[uuid.UUID]engine.Task{task.ID: task}, w)))
	require.Zero(t, p.Cold(), "the view has no more")
	require.Nil(t, p.Warm())
	require.Equal(t, store.Running, get(t, p, inv.TaskID).Status, "the queued row did not bring the task back")
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
		record(p.Invoke(invocation("a", 0), settings(1), "", t0))
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
		queued := c.Task
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
		record(p.Invoke(invocation("a", 0), settings(1), "", at(3*time.Second)))
	}
	p.Materialized(offset - 1)
	require.Equal(t, 17, p.Cold(), "eleven more went cold")
	require.Zero(t, p.Warmed(w, nil))
	require.Equal(t, 17, p.Cold(), "a read that began before they went cold says nothing of them")
}
