package owner

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// A claim that spans partitions takes the highest priorities any of them
// has first, whichever partition its turn starts at; within a priority the
// partitions take turns.
func TestShareOutTakesTheHighestPrioritiesAcrossPartitions(t *testing.T) {
	t.Parallel()
	withLevels := func(id int32, levels map[string][]engine.Level) *partition {
		return &partition{id: id, ready: levels}
	}
	a, b := store.Key("ns", "a"), store.Key("ns", "b")
	parts := []*partition{
		withLevels(0, map[string][]engine.Level{a: {{Priority: 5, Count: 2}, {Priority: 1, Count: 10}}}),
		withLevels(1, map[string][]engine.Level{a: {{Priority: 1, Count: 10}}}),
		// Two actions of one claim merge by priority.
		withLevels(2, map[string][]engine.Level{a: {{Priority: 9, Count: 1}, {Priority: 0, Count: 5}}, b: {{Priority: 1, Count: 1}}}),
		withLevels(3, map[string][]engine.Level{store.Key("other", "a"): {{Priority: 99, Count: 4}}}),
	}
	r := &Replica{}
	slots := make([]engine.Slot, 6)
	for turn := range parts {
		asks := r.shareOut(parts, "ns", []string{"a", "b"}, slots)
		got := map[int32]int{}
		total := 0
		for _, ask := range asks {
			got[ask.p.id] = len(ask.slots)
			total += len(ask.slots)
		}
		require.Equal(t, len(slots), total, "turn %d: %v", turn, got)
		// 9 and 5 first; then 3 of priority 1, from one partition or
		// another as the turn goes, the two of p2 (9, then its 1 of b).
		require.GreaterOrEqual(t, got[2], 1, "turn %d: %v", turn, got)
		require.GreaterOrEqual(t, got[0], 2, "turn %d: %v", turn, got)
		require.Zero(t, got[3], "another namespace's tasks")
		require.Equal(t, 3, got[0]-2+got[1]+got[2]-1, "turn %d: three of priority 1: %v", turn, got)
	}
	require.Empty(t, r.shareOut(parts, "ns", []string{"c"}, slots), "nothing ready")
}

// A partition asked for slots of the priorities it published fills only as
// many as it still has of them: tasks counted may have gone meanwhile (to
// a waiting claim, or cold), and filling the rest with a lower priority
// would hand it out before the higher ones other partitions hold.
func TestAClaimTakesNoPriorityBelowWhatItWasSharedOutFor(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	p := &partition{eng: engine.New(0)}
	s := &store.Settings{Timeout: time.Minute, MaxAttempts: 1}
	invoke := func(prio int32) {
		p.eng.Invoke(nil, engine.Invocation{TaskID: uuid.New(), Namespace: "ns", Action: "a", Payload: []byte(`{}`), Priority: prio, InvokedAt: now}, s, "", now)
	}
	for range 4 {
		invoke(2)
	}
	invoke(0)
	r := &Replica{}
	p.ready = map[string][]engine.Level{store.Key("ns", "a"): p.eng.ReadyLevels("ns", "a", now)}
	asks := r.shareOut([]*partition{p}, "ns", []string{"a"}, make([]engine.Slot, 4))
	require.Len(t, asks, 1)
	require.Equal(t, int32(2), asks[0].floor)

	// Two of the four go elsewhere before the claim is applied.
	taken, _ := p.eng.Claim("ns", []string{"a"}, make([]engine.Slot, 2), now)
	require.Len(t, taken, 2)
	o := &claimOp{ns: "ns", actions: []string{"a"}, slots: asks[0].slots, floor: asks[0].floor}
	o.apply(p, now, nil)
	require.Len(t, o.got, 2, "the two of priority 2 left, not the one of priority 0")
	for _, c := range o.got {
		require.Equal(t, int32(2), c.Task.Priority)
	}
}
