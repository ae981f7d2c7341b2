package owner

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/dispatcher/internal/engine"
)

func workers(slots []engine.Slot) []string {
	out := make([]string, len(slots))
	for i, s := range slots {
		out[i] = s.WorkerID
	}
	return out
}

func TestTurnsGiveEachSlotOneTaskInTurn(t *testing.T) {
	slots := turns([]Slot{{WorkerID: "a", Count: 3}, {WorkerID: "b", Count: 1}, {WorkerID: "c", Count: 2}}, 0)
	require.Equal(t, []string{"a", "b", "c", "a", "c", "a"}, workers(slots))
}

func TestStandingReservesSlotsInTurnAndTakesBackTheUnfilled(t *testing.T) {
	s := newStanding("ns", []string{"x"}, turns([]Slot{{WorkerID: "a", Count: 2}, {WorkerID: "b", Count: 2}}, 0))

	first := s.reserve(3)
	require.Equal(t, []string{"a", "b", "a"}, workers(first))
	second := s.reserve(5)
	require.Equal(t, []string{"b"}, workers(second))
	require.Empty(t, s.reserve(1), "every slot is reserved")

	// The first partition filled one slot: the engine fills from the
	// first, so b and a come back, to be reserved next and in that order.
	s.deliver(first, []engine.Claimed{{Slot: 0}})
	require.Equal(t, []string{"b", "a"}, workers(s.reserve(2)))

	_, served := s.finishIfServed()
	require.False(t, served, "two partitions still owe a delivery")
}
