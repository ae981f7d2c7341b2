package workerstream

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func TestPoolUsesOldestGrantsFirst(t *testing.T) {
	now := time.Unix(1000, 0)
	var p grants
	p.add(2, now.Add(time.Second))
	p.add(3, now.Add(3*time.Second))
	p.add(1, now.Add(2*time.Second))

	p.consume(3) // all of the first grant, one of the second
	expired, credit, next := p.expire(now)
	require.Zero(t, expired)
	require.Equal(t, 3, credit)
	require.Equal(t, now.Add(2*time.Second), next)

	// The second grant (2 left) expires after the third (1 left).
	expired, credit, next = p.expire(now.Add(2 * time.Second))
	require.Equal(t, 1, expired)
	require.Equal(t, 2, credit)
	require.Equal(t, now.Add(3*time.Second), next)

	expired, credit, next = p.expire(now.Add(time.Hour))
	require.Equal(t, 1, expired)
	require.Zero(t, credit)
	require.True(t, next.IsZero())
}

func TestPoolFullyUsedGrantsDoNotExpire(t *testing.T) {
	now := time.Unix(1000, 0)
	var p grants
	p.add(1, now.Add(time.Second))
	p.add(1, now.Add(time.Second))
	p.consume(2)
	expired, credit, _ := p.expire(now.Add(time.Hour))
	require.Zero(t, expired, "a grant that got its tasks gets no empty batch")
	require.Zero(t, credit)
}

func TestPoolCreditIsCapped(t *testing.T) {
	var p grants
	deadline := time.Now().Add(time.Hour)
	require.True(t, p.add(maxCredit-1, deadline))
	require.True(t, p.add(10, deadline))
	require.False(t, p.add(10, deadline))
	_, credit, _ := p.expire(time.Now())
	require.Equal(t, maxCredit, credit)
	require.Len(t, p.list, 2, "a Ready that adds nothing leaves no grant")
}

// A full set looks for long-ended leases only once its earliest can have
// ended, and an attempt adopted from another stream counts as early as any.
func TestHeldSweepsOnceTheEarliestLeaseEnded(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newHeld(2)
	h.add([]*flov1.TaskAssignment{
		{TaskId: "a", LeaseUntil: timestamppb.New(now.Add(time.Minute))},
		{TaskId: "b", LeaseUntil: timestamppb.New(now.Add(2 * time.Minute))},
	}, now)
	require.Zero(t, h.room(now))
	h.put(attemptKey("adopted", 1), now.Add(-2*leaseGrace))
	require.Zero(t, h.room(now), "the adopted attempt's lease ended long ago")
	require.Equal(t, 2, h.len())
	later := now.Add(time.Minute + leaseGrace + time.Second)
	require.Equal(t, 1, h.room(later), "a's lease ended long ago by then")
	require.Equal(t, 1, h.len(), "b's lease is still live")
}

func TestPoolKeySeparatesActionsAndLease(t *testing.T) {
	require.NotEqual(t, poolKey([]string{"a", "b"}, 0), poolKey([]string{"ab"}, 0))
	require.NotEqual(t, poolKey([]string{"a"}, 0), poolKey([]string{"a"}, 1))
	require.Equal(t, poolKey([]string{"a", "b"}, 5), poolKey([]string{"a", "b"}, 5))
}

func TestHeldBoundsAndForgetsLongExpiredLeases(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newHeld(2)
	emptied := h.emptied()
	h.add([]*flov1.TaskAssignment{
		{TaskId: "old", LeaseUntil: timestamppb.New(now.Add(-2 * leaseGrace))},
		{TaskId: "live", LeaseUntil: timestamppb.New(now.Add(time.Minute))},
	}, now)
	require.Equal(t, 1, h.room(now), "the long-expired lease no longer takes room")
	require.Equal(t, 1, h.len())

	h.add([]*flov1.TaskAssignment{{TaskId: "new"}}, now)
	require.Zero(t, h.room(now))
	require.True(t, h.remove([]string{attemptKey("live", 0)}), "it was full")
	require.False(t, h.remove([]string{attemptKey("new", 0)}))
	select {
	case <-emptied:
	default:
		require.Fail(t, "emptying the set signals")
	}
}
