package catalog

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/migrations"
)

// With Postgres away, actions cached past their TTL are still answered, so
// dispatch goes on through an outage; an action never looked up is an
// error, not a guess.
func TestLookupServesStaleActionsWhenPostgresIsAway(t *testing.T) {
	ctx := context.Background()
	pool, err := pg.Open(ctx, harness.NewDatabase(t), "dispatcher", 4, migrations.FS, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	cat := New(pool, 0)
	clock := harness.NewClock(time.Now())
	cat.now = clock.Now
	require.NoError(t, cat.Bootstrap(ctx, []string{"ns"}))
	_, err = cat.Register(ctx, "ns", "work", Spec{MaxAttempts: 4})
	require.NoError(t, err)
	refs := []Ref{{Namespace: "ns", Action: "work"}, {Namespace: "ns", Action: "missing"}}
	got, err := cat.Lookup(ctx, pool, refs)
	require.NoError(t, err)
	require.Len(t, got, 1)

	clock.Advance(2 * cacheTTL)
	pool.Close()
	got, err = cat.Lookup(ctx, pool, refs)
	require.NoError(t, err)
	require.Equal(t, int32(4), got[store.Key("ns", "work")].MaxAttempts)
	require.NotContains(t, got, store.Key("ns", "missing"), "known missing stays missing")
	_, err = cat.Lookup(ctx, pool, []Ref{{Namespace: "ns", Action: "never-seen"}})
	require.Error(t, err)
}
