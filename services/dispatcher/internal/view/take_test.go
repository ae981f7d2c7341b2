package view

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// A buffer over the batch bound is written in batches whose offsets never
// pass a state left behind.
func TestTakeCutsOffsetsBeforeStatesLeftBehind(t *testing.T) {
	t.Parallel()
	m, err := NewMaterializer(nil, 4, nil, noop.NewMeterProvider().Meter("test"), nil)
	require.NoError(t, err)
	task := func(id uuid.UUID) engine.Task { return engine.Task{ID: id, Status: store.Queued} }
	for o := int64(1); o <= 3; o++ {
		m.Add(Entry{Partition: 1, Offset: o, CmdOffset: o, Task: task(uuid.New())})
	}
	// Task a is created at 5,000 and changed again at 20,000: its state
	// is among the newest, but the view lacks it from 5,000 on.
	a := uuid.New()
	for o := int64(1); o <= 9998; o++ {
		id := uuid.New()
		if o == 5000 {
			id = a
		}
		m.Add(Entry{Partition: 0, Offset: o, CmdOffset: o / 2, Task: task(id)})
	}
	m.Add(Entry{Partition: 0, Offset: 20_000, CmdOffset: 12_000, Task: task(a)})
	require.Equal(t, int64(maxBatch+1), m.Lag())

	batches := m.take(false, true)
	require.Len(t, batches, 2)
	require.Zero(t, len(m.buf))
	require.Equal(t, int64(maxBatch+1), m.Lag())
	first, second := batches[0], batches[1]
	require.Len(t, first.owners, maxBatch)
	require.NotContains(t, ids(first), a)
	require.Equal(t, []mark{
		{partition: 0, events: 5000, commands: 4999 / 2, last: 9998},
		{partition: 1, events: 4, commands: 3, last: 3},
	}, marksOf(m, first))
	require.Equal(t, []uuid.UUID{a}, ids(second))
	require.Equal(t, []mark{{partition: 0, events: 20_001, commands: 12_000, last: 20_000}}, marksOf(m, second))
	require.Nil(t, m.take(false, true))
}

// ids are the task ids of a batch's rows.
func ids(b *batch) []uuid.UUID {
	out := make([]uuid.UUID, len(b.owners))
	for i, s := range b.owners {
		out[i] = s.Task.ID
	}
	return out
}

// marksOf are the offsets writing b would take its partitions to, nothing
// refused.
func marksOf(m *Materializer, b *batch) []mark {
	marks, _ := m.marks(b, nil)
	return marks
}

// A flush holds back the states of live tasks buffered less than liveHold
// ago, and the partition's offsets stop before them; final states, states
// older than liveHold and, for Flush, every state are taken.
func TestTakeHoldsYoungLiveStatesBack(t *testing.T) {
	t.Parallel()
	m, err := NewMaterializer(nil, 4, nil, noop.NewMeterProvider().Meter("test"), nil)
	require.NoError(t, err)
	young, old, done, other := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	m.Add(Entry{Partition: 0, Offset: 10, CmdOffset: 5, Task: engine.Task{ID: old, Status: store.Running}})
	m.buf[old].added = m.buf[old].added.Add(-liveHold)
	m.Add(
		Entry{Partition: 0, Offset: 11, CmdOffset: 6, Task: engine.Task{ID: young, Status: store.Queued}},
		Entry{Partition: 0, Offset: 12, CmdOffset: 7, Task: engine.Task{ID: done, Status: store.Completed}},
		Entry{Partition: 1, Offset: 3, CmdOffset: 2, Task: engine.Task{ID: other, Status: store.Waiting}},
	)

	batches := m.take(false, false)
	require.Len(t, batches, 1)
	require.ElementsMatch(t, []uuid.UUID{old, done}, ids(batches[0]))
	// Partition 0 stops before the held state at 11; partition 1 has
	// nothing written and no mark.
	require.Equal(t, []mark{{partition: 0, events: 11, commands: 5, last: 12}}, marksOf(m, batches[0]))
	require.Equal(t, int64(4), m.Lag(), "held states count as lag")
	require.Len(t, m.buf, 2)

	// A newer state of a held task replaces it, and a final one is taken at
	// once, the held state's first record still stopping the offsets of
	// what is left.
	m.Add(Entry{Partition: 0, Offset: 13, CmdOffset: 8, Task: engine.Task{ID: young, Status: store.Completed}})
	batches = m.take(false, false)
	require.Len(t, batches, 1)
	require.Equal(t, []uuid.UUID{young}, ids(batches[0]))
	require.Equal(t, []mark{{partition: 0, events: 14, commands: 8, last: 13}}, marksOf(m, batches[0]))

	// Flush's take holds nothing back.
	batches = m.take(false, true)
	require.Len(t, batches, 1)
	require.Equal(t, []uuid.UUID{other}, ids(batches[0]))
	require.Empty(t, m.buf)
}

// States added while a take chooses what to hold back are neither lost nor
// written out of order: every task's newest state is taken last.
func TestTakeWhileAddingLosesNoState(t *testing.T) {
	t.Parallel()
	m, err := NewMaterializer(nil, 4, nil, noop.NewMeterProvider().Meter("test"), nil)
	require.NoError(t, err)
	const n = 20_000
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i, id := range ids {
			m.Add(Entry{Partition: 0, Offset: int64(2 * i), Task: engine.Task{ID: id, Status: store.Queued}})
		}
		for i, id := range ids {
			m.Add(Entry{Partition: 0, Offset: int64(2*i + 1), Task: engine.Task{ID: id, Status: store.Completed}})
		}
	}()
	newest := map[uuid.UUID]int64{}
	collect := func(batches []*batch) {
		for _, b := range batches {
			for _, s := range b.owners {
				require.Greater(t, s.Offset, newest[s.Task.ID]-1, "task %s: an older state taken after a newer one", s.Task.ID)
				newest[s.Task.ID] = s.Offset
			}
		}
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		collect(m.take(false, false))
	}
	collect(m.take(false, true))
	require.Len(t, newest, n)
	for i, id := range ids {
		require.Equal(t, int64(2*i+1), newest[id], "task %d's final state", i)
	}
	require.Zero(t, m.Lag())
}

// Past maxHeld the oldest held states are written first, whichever
// partition holds them; a held state whose time is up is written whatever
// the other partitions hold; each partition's offsets stop before its oldest
// state still held.
func TestTakeWritesTheOldestHeldStatesFirst(t *testing.T) {
	t.Parallel()
	m, err := NewMaterializer(nil, 4, nil, noop.NewMeterProvider().Meter("test"), nil)
	require.NoError(t, err)
	queued := func() engine.Task { return engine.Task{ID: uuid.New(), Status: store.Queued} }
	var older, newer []uuid.UUID
	for o := int64(1); o <= maxHeld; o++ {
		e := Entry{Partition: 0, Offset: o, CmdOffset: o, Task: queued()}
		m.Add(e)
		m.buf[e.Task.ID].added = m.buf[e.Task.ID].added.Add(-time.Second)
		older = append(older, e.Task.ID)
	}
	for o := int64(1); o <= 10; o++ {
		e := Entry{Partition: 1, Offset: o, CmdOffset: o, Task: queued()}
		m.Add(e)
		newer = append(newer, e.Task.ID)
	}

	batches := m.take(false, false)
	require.Len(t, batches, 1)
	require.ElementsMatch(t, older[:10], ids(batches[0]))
	require.Equal(t, []mark{{partition: 0, events: 11, commands: 10, last: 10}}, marksOf(m, batches[0]))
	require.Equal(t, int64(maxHeld+10), m.Lag())

	for _, id := range newer {
		m.buf[id].added = m.buf[id].added.Add(-liveHold)
	}
	batches = m.take(false, false)
	require.Len(t, batches, 1)
	require.ElementsMatch(t, newer, ids(batches[0]))
	require.Equal(t, []mark{{partition: 1, events: 11, commands: 10, last: 10}}, marksOf(m, batches[0]))
	require.Len(t, m.buf, maxHeld-10)
}
