package engine

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// Tasks that go cold leave nothing behind that keeps them in memory: no
// index or payload item still points at their entries, the indexes and
// payload lists give their room back, and the tasks map is made anew once
// most of it went.
func TestGoingColdLetsTheEntriesGo(t *testing.T) {
	t.Parallel()
	p := New(0)
	p.SetLimits(Limits{QueuedTasks: 100, PayloadBytes: 1 << 20, Horizon: 2 * time.Hour})
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	set := &store.Settings{Timeout: time.Second, MaxAttempts: 1}
	for i := range 5000 {
		inv := Invocation{TaskID: uuid.New(), Namespace: "ns", Action: "a", Payload: []byte("{}"), InvokedAt: now}
		if i%2 == 0 {
			inv.RunAt = now.Add(time.Hour) // delayed
		}
		c := p.Invoke(nil, inv, set, "", now)
		p.Recorded(c[0].Task.ID, int64(i))
	}
	p.Materialized(5000)
	require.Equal(t, 90, p.Queued())
	require.Equal(t, 4910, p.Cold())
	live := 0
	for _, h := range append([]*heap{&p.delayed}, func() (hs []*heap) {
		for _, h := range p.ready {
			hs = append(hs, h)
		}
		return hs
	}()...) {
		require.Equal(t, h.live, len(h.items), "no stale item left")
		require.LessOrEqual(t, cap(h.items), max(64, 4*len(h.items)), "room given back")
		live += h.live
	}
	require.Equal(t, 90, live)
	require.Len(t, p.tasks, 90)
	for _, items := range [][]item{p.hot, p.recorded} {
		for _, it := range items {
			require.NotNil(t, p.tasks[it.e.t.ID], "a payload item of a task let go")
		}
		require.LessOrEqual(t, cap(items), max(64, 4*len(items)), "room given back")
	}
	require.Empty(t, p.delayed.items, "delayed tasks go cold first")
}

// A change recorded late, after its task was done and let go, reaches the
// entry it was made to only while that entry is unchanged: it changes
// nothing once the entry left, as a lookup by id would find nothing.
func TestRecordedAllSkipsAnEntryThatChangedSince(t *testing.T) {
	t.Parallel()
	p := New(0)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	set := &store.Settings{Timeout: time.Minute, MaxAttempts: 1}
	inv := Invocation{TaskID: uuid.New(), Namespace: "ns", Action: "a", Payload: []byte("{}"), InvokedAt: now}
	created := p.Invoke(nil, inv, set, "", now)
	_, started := p.Claim("ns", []string{"a"}, make([]Slot, 1), now)
	ok, done := p.Report(nil, "ns", Report{TaskID: inv.TaskID.String(), Attempt: 1, Kind: Complete}, now)
	require.True(t, ok)
	e := p.tasks[inv.TaskID]
	p.RecordedAll(append(started, done...), []int64{1, 2})
	require.Equal(t, int64(2), e.last, "the entry took the offset of its last change")
	p.Materialized(2)
	require.False(t, p.Has(inv.TaskID), "the done task was let go")

	p.RecordedAll(created, []int64{3})
	require.Equal(t, int64(2), e.last, "the entry it was made to had changed since")
	require.Empty(t, p.evictable.items)
}
