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

	// The first partition's transaction failed: its slots come back, to
	// be reserved next and in their order.
	s.deliver(first, nil)
	require.Equal(t, []string{"a", "b"}, workers(s.reserve(2)))

	_, served := s.finishIfServed()
	require.False(t, served, "two partitions still owe a delivery and nothing came")
}

func TestStandingWithTasksTakesNoMoreReservationsAndAnswersWhenOwedDeliveriesCome(t *testing.T) {
	s := newStanding("ns", []string{"x"}, turns([]Slot{{WorkerID: "a", Count: 3}, {WorkerID: "b", Count: 3}}, 0))
	first, second := s.reserve(2), s.reserve(2)
	require.Len(t, first, 2)
	require.Len(t, second, 2)

	s.deliver(first, []engine.Claimed{{Slot: 0}})
	require.Empty(t, s.reserve(1), "a claim that was handed tasks takes no more, though two slots are free")
	_, served := s.finishIfServed()
	require.False(t, served, "the second partition still owes its delivery")

	s.deliver(second, []engine.Claimed{{Slot: 2}, {Slot: 3}})
	got, served := s.finishIfServed()
	require.True(t, served)
	require.Len(t, got, 3, "the claim answers with what both partitions leased")
}
