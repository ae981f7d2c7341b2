package catalog_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/dispatcher/internal/catalog"
	"github.com/razorbill/flo/services/dispatcher/migrations"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// requireExhausted checks err is the action quota's refusal, naming its setting.
func requireExhausted(t *testing.T, err error) {
	t.Helper()
	kind, msg, ok := fault.KindOf(err)
	require.True(t, ok, "not a fault: %v", err)
	require.Equal(t, fault.Exhausted, kind, msg)
	require.Contains(t, msg, "the limit is 3 (FLO_MAX_ACTIONS_PER_NAMESPACE)")
}

func TestActionsPerNamespaceLimit(t *testing.T) {
	ctx := context.Background()
	pool, err := pg.Open(ctx, harness.NewDatabase(t), "dispatcher", 8, migrations.FS, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cat := catalog.New(pool, 3)
	require.NoError(t, cat.Bootstrap(ctx, []string{"full", "other"}))

	// Six registrations race for three places: exactly three get one.
	errs := make([]error, 6)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = cat.Register(ctx, "full", fmt.Sprintf("a%d", i), catalog.Spec{})
		}()
	}
	wg.Wait()
	var admitted []string
	for i, err := range errs {
		if err != nil {
			requireExhausted(t, err)
			continue
		}
		admitted = append(admitted, fmt.Sprintf("a%d", i))
	}
	require.Len(t, admitted, 3)

	// At the limit, registering an existing action again changes its settings.
	_, err = cat.Register(ctx, "full", admitted[0], catalog.Spec{MaxAttempts: 7})
	require.NoError(t, err)
	a, err := cat.Get(ctx, "full", admitted[0])
	require.NoError(t, err)
	require.EqualValues(t, 7, a.MaxAttempts)

	// Ensure: known names pass, one new name among them does not.
	_, err = cat.Ensure(ctx, "full", admitted)
	require.NoError(t, err)
	_, err = cat.Ensure(ctx, "full", append([]string{"fresh"}, admitted...))
	requireExhausted(t, err)

	// Each namespace has its own room.
	_, err = cat.Ensure(ctx, "other", []string{"x", "y", "y", "z"})
	require.NoError(t, err)
	_, err = cat.Register(ctx, "other", "w", catalog.Spec{})
	requireExhausted(t, err)

	var stored int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM dispatcher.actions WHERE namespace = 'full'`).Scan(&stored))
	require.Equal(t, 3, stored, "nothing refused was stored")
}
