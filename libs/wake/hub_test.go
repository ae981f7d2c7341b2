package wake_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/wake"
)

const waitFor = 10 * time.Second

func signalled(w *wake.Waiter) bool {
	select {
	case <-w.C():
		return true
	default:
		return false
	}
}

func TestHubWakesOnlyMatchingWaiters(t *testing.T) {
	t.Parallel()
	h := wake.NewHub()
	a := h.Subscribe([]string{"ns/a"})
	ab := h.Subscribe([]string{"ns/a", "ns/b"})
	c := h.Subscribe([]string{"ns/c"})
	h.Wake("ns/b")
	require.False(t, signalled(a))
	require.True(t, signalled(ab))
	require.False(t, signalled(c))

	// A wake-up while nobody reads is kept (once), not lost.
	h.Wake("ns/a")
	h.Wake("ns/a")
	require.True(t, signalled(a))
	require.False(t, signalled(a))

	h.Unsubscribe(a)
	h.Wake("ns/a")
	require.False(t, signalled(a))
	require.True(t, signalled(ab))

	h.WakeAll()
	require.True(t, signalled(ab))
	require.True(t, signalled(c))
}

func TestHubTimersAndSafetyTick(t *testing.T) {
	t.Parallel()
	h := wake.NewHub()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx, time.Hour) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	w := h.Subscribe([]string{"ns/delayed"})
	other := h.Subscribe([]string{"ns/other"})
	h.WakeAt("ns/delayed", time.Now().Add(time.Hour))
	h.WakeAt("ns/delayed", time.Now().Add(20*time.Millisecond))
	select {
	case <-w.C():
	case <-time.After(waitFor):
		t.Fatal("timer never fired")
	}
	require.False(t, signalled(other))

	ticking := wake.NewHub()
	tctx, tcancel := context.WithCancel(context.Background())
	defer tcancel()
	go func() { _ = ticking.Run(tctx, 10*time.Millisecond) }()
	idle := ticking.Subscribe([]string{"ns/idle"})
	select {
	case <-idle.C():
	case <-time.After(waitFor):
		t.Fatal("safety tick never woke the waiter")
	}
}

func TestHubProbeTakesTurnsOneWaiterPerKey(t *testing.T) {
	t.Parallel()
	h := wake.NewHub()
	many := []*wake.Waiter{h.Subscribe([]string{"ns/k"}), h.Subscribe([]string{"ns/k"}), h.Subscribe([]string{"ns/k"})}
	solo := h.Subscribe([]string{"ns/solo"})

	probed := map[*wake.Waiter]int{}
	for range len(many) {
		h.Probe()
		n := 0
		for _, w := range many {
			if signalled(w) {
				require.True(t, w.Probed())
				require.False(t, w.Probed(), "Probed clears")
				probed[w]++
				n++
			}
		}
		require.Equal(t, 1, n, "one waiter of the key per probe")
		require.True(t, signalled(solo))
		require.True(t, solo.Probed())
	}
	require.Len(t, probed, len(many), "every waiter gets its turn")
	require.Equal(t, uint64(len(many)), h.Probes())
	require.Equal(t, len(many)+1, h.Waiters())

	// A waiter probed for one of its keys covers the others: two keys whose
	// waiters all wait on both cost one look per probe.
	both := []*wake.Waiter{h.Subscribe([]string{"ns/g", "ns/t"}), h.Subscribe([]string{"ns/g", "ns/t"})}
	for range 2 {
		h.Probe()
		n := 0
		for _, w := range both {
			if signalled(w) {
				n++
			}
		}
		require.Equal(t, 1, n)
	}
	for _, w := range both {
		require.True(t, w.Probed(), "each took its turn")
		h.Unsubscribe(w)
	}
	for _, w := range append(many, solo) {
		signalled(w)
		w.Probed()
	}

	// A plain wake-up is not a probe.
	h.Wake("ns/k")
	for _, w := range many {
		require.True(t, signalled(w))
		require.False(t, w.Probed())
	}
}

func TestHubRunProbingProbesOnTheSafetyTick(t *testing.T) {
	t.Parallel()
	h := wake.NewHub()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.RunProbing(ctx, 10*time.Millisecond) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	idle := h.Subscribe([]string{"ns/idle"})
	select {
	case <-idle.C():
		require.True(t, idle.Probed())
	case <-time.After(waitFor):
		t.Fatal("safety tick never probed the waiter")
	}
}

func TestHubStampChangesOnWakeUpsOnly(t *testing.T) {
	t.Parallel()
	h := wake.NewHub()
	require.Zero(t, h.Stamp("ns/a"), "no waiters")
	w := h.Subscribe([]string{"ns/a", "ns/b"})
	s := h.Stamp("ns/a", "ns/b")
	require.NotZero(t, s)

	h.Probe()
	h.Wake("ns/other")
	require.Equal(t, s, h.Stamp("ns/a", "ns/b"), "a probe or another key's wake-up is no news")

	for _, wake := range []func(){func() { h.Wake("ns/b") }, h.WakeAll} {
		wake()
		next := h.Stamp("ns/a", "ns/b")
		require.NotEqual(t, s, next)
		s = next
	}

	// The keys losing their waiters and getting new ones counts as news.
	h.Unsubscribe(w)
	h.Subscribe([]string{"ns/a", "ns/b"})
	require.NotEqual(t, s, h.Stamp("ns/a", "ns/b"))
}
