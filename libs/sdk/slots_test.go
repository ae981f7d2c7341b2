package flo

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The worker's books must match the gateway's: grants used oldest first, one empty batch per
// expired grant, and never more credit plus running tasks than slots.
func TestSlotsMirrorTheServersGrants(t *testing.T) {
	t.Parallel()
	s := &slots{size: 4}
	require.Equal(t, 4, s.grant())
	require.Equal(t, 0, s.grant(), "every slot is promised")

	require.True(t, s.acquire())
	require.True(t, s.acquire())
	require.Equal(t, []int{2}, s.grants)
	s.release()
	require.Equal(t, 1, s.grant())
	require.Equal(t, []int{2, 1}, s.grants)

	// Three tasks arrive: two use up the first grant, one comes out of the second.
	require.True(t, s.acquire())
	require.True(t, s.acquire())
	require.True(t, s.acquire())
	require.False(t, s.acquire(), "all four slots are busy")
	require.Empty(t, s.grants)
	require.Equal(t, 0, s.credit)
	require.Equal(t, 4, s.running())

	for range 4 {
		s.release()
	}
	require.Equal(t, 4, s.grant())
	require.Equal(t, 0, s.grant())
	s.consume() // a task handed back at once while stopping
	require.Equal(t, []int{3}, s.grants)
	s.expire()
	require.Empty(t, s.grants)
	require.Equal(t, 4, s.grant())
	s.expire()
	s.expire() // an expiry the books do not know changes nothing
	require.Equal(t, 0, s.credit)

	require.Equal(t, 4, s.grant())
	s.reset()
	require.Equal(t, 4, s.grant(), "credit of a dead stream is asked for again")
}
