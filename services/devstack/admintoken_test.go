package devstack

import (
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAdminTokenFromConfigWins(t *testing.T) {
	dir := t.TempDir()
	token, err := resolveAdminToken(Config{DataDir: dir, AdminToken: "given"})
	require.NoError(t, err)
	require.Equal(t, "given", token)
	_, err = os.Stat(filepath.Join(dir, adminTokenFile))
	require.ErrorIs(t, err, os.ErrNotExist, "a configured token writes no file")
}

func TestAdminTokenIsMadeOnceAndKeptPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	cfg := Config{DataDir: dir}
	// Stacks starting at once on one data dir agree on one token.
	tokens := make([]string, 4)
	var wg sync.WaitGroup
	for i := range tokens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			tokens[i], err = resolveAdminToken(cfg)
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	require.Regexp(t, regexp.MustCompile(`^flo_admin_[0-9a-f]{64}$`), tokens[0])
	for _, tok := range tokens {
		require.Equal(t, tokens[0], tok)
	}

	info, err := os.Stat(filepath.Join(dir, adminTokenFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary files left behind")

	again, err := resolveAdminToken(cfg)
	require.NoError(t, err)
	require.Equal(t, tokens[0], again, "a restart keeps the token")

	other, err := resolveAdminToken(Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	require.NotEqual(t, tokens[0], other, "each data dir has its own token")
}
