package auth

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/keyformat"
)

func TestKeyCacheIsBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	a := newAuthenticator("admin", func(context.Context, string) (StoredKey, error) { return StoredKey{}, ErrKeyNotFound },
		time.Second, clock, slog.New(slog.DiscardHandler))
	a.max = 100
	unknown := func() {
		k, err := keyformat.Generate()
		require.NoError(t, err)
		_, err = a.authenticate(t.Context(), k.String())
		require.Error(t, err)
	}
	for range 250 {
		unknown()
		require.LessOrEqual(t, len(a.cache), a.max)
	}
	for len(a.cache) < a.max {
		unknown()
	}
	// Once the answers are stale, a full cache drops them all at the next
	// insert rather than a tenth.
	now = now.Add(time.Second)
	unknown()
	require.Equal(t, 1, len(a.cache))
}

func TestLimiterMapIsBoundedAndPrunesIdleKeys(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := newLimiter(map[Role]float64{RoleClient: 1}, func() time.Time { return now })
	l.max = 100
	for i := range 100 {
		ok, _ := l.allow(Principal{KeyID: fmt.Sprint("k", i), Role: RoleClient})
		require.True(t, ok)
	}
	now = now.Add(limiterIdle)
	ok, _ := l.allow(Principal{KeyID: "k0", Role: RoleClient})
	require.True(t, ok, "k0 is not new: no prune")
	ok, _ = l.allow(Principal{KeyID: "new", Role: RoleClient})
	require.True(t, ok)
	require.Len(t, l.keys, 2, "the idle keys went when the map was full; k0 was just used")

	for i := range 250 {
		l.allow(Principal{KeyID: fmt.Sprint("busy", i), Role: RoleClient})
		require.LessOrEqual(t, len(l.keys), l.max)
	}
	ok, _ = l.allow(Principal{KeyID: "unlimited", Role: RoleAdmin})
	require.True(t, ok)
	require.NotContains(t, l.keys, "unlimited", "an unlimited role keeps no limiter")
}
