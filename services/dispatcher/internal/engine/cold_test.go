package engine_test

import (
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
// once the view has them: the partition keeps their ids and places only.
// They are not claimed; once the partition holds half the bound or less it
// reads the next ones back, in hand-out order, and a cold task replayed
// from the log is held again with its payload left in the view.
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
	cold := order[20]
	require.True(t, p.Has(cold), "a cold task is known")
	_, held := p.Get(cold)
	require.False(t, held, "but not held")
	require.Empty(t, p.Invoke(engine.Invocation{TaskID: cold, Namespace: ns, Action: "a"}, settings(3), "", at(time.Second)),
		"a repeated invocation of a cold task changes nothing")
	require.Nil(t, p.Warm(), "no read back while the partition holds more than half the bound")

	claimed, _ := p.Claim(ns, []string{"a"}, make([]engine.Slot, 5), at(2*time.Second))
	require.Len(t, claimed, 5)
	require.Equal(t, 4, p.Queued())
	w := p.Warm()
	require.NotNil(t, w)
	ids := w.IDs()
	require.Len(t, ids, 5, "back to nine tenths of the bound")
	require.Equal(t, 21, p.Cold(), "cold until read")

	// A read that failed puts them back.
	p.Unwarm(w)
	w = p.Warm()
	require.Equal(t, ids, w.IDs(), "the same, in the same order")
	var read []engine.Task
	for _, id := range w.IDs() {
		read = append(read, view[id])
	}
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
			read = read[:0]
			for _, id := range w.IDs() {
				read = append(read, view[id])
			}
			p.Warmed(w, read)
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

// A cold task that the log says moved on (a rebuild replays a later record)
// is held again, its payload left in the view.
func TestReplayedColdTaskIsHeldAgain(t *testing.T) {
	t.Parallel()
	inv := invocation("a", 0)
	task := engine.New(0).Invoke(inv, settings(3), "", t0)[0].Task
	p := engine.New(0)
	p.SetLimits(engine.Limits{QueuedTasks: 2})
	p.LoadCold(task)
	require.Equal(t, 1, p.Cold())
	started := task
	started.Status, started.Attempt, started.WorkerID, started.Payload = store.Running, 1, "w1", nil
	started.LeaseUntil = at(time.Minute)
	p.Apply(engine.Change{Type: taskevent.Started, Task: started})
	require.Zero(t, p.Cold())
	got := get(t, p, inv.TaskID)
	require.Equal(t, store.Running, got.Status)
	require.True(t, got.PayloadOut, "the payload is read from the view when needed")
}
