package namespace

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCacheRemembersOnlyNamespacesThatExist(t *testing.T) {
	existing := map[string]bool{"default": true}
	calls := 0
	c := NewCache(func(_ context.Context, name string) error {
		calls++
		if !existing[name] {
			return ErrNotFound
		}
		return nil
	})
	ctx := context.Background()

	require.ErrorIs(t, c.Check(ctx, ""), ErrEmpty)
	require.Zero(t, calls)
	require.NoError(t, c.Check(ctx, "default"))
	require.NoError(t, c.Check(ctx, "default"))
	require.Equal(t, 1, calls)

	require.ErrorIs(t, c.Check(ctx, "later"), ErrNotFound)
	existing["later"] = true
	require.NoError(t, c.Check(ctx, "later"), "a miss is not remembered")

	c.Remember("made-here")
	require.NoError(t, c.Check(ctx, "made-here"))
	require.Equal(t, 3, calls)
}
