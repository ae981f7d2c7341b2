package owner

import (
	"testing"

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
