package localpg_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/localpg"
)

// dataDir returns a fresh directory the postgres user can reach even when the
// tests run as root (t.TempDir is private to its creator).
func dataDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	return filepath.Join(dir, "nested", "data")
}

func query(t *testing.T, url, sql string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var out string
	require.NoError(t, conn.QueryRow(ctx, sql).Scan(&out))
	return out
}

func TestStartCreateRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := dataDir(t)
	srv, err := localpg.Start(ctx, dir, 0, localpg.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	require.Zero(t, srv.Port(), "port 0: the unix socket only")
	require.Equal(t, "", query(t, srv.URL("postgres"), "SHOW listen_addresses"))
	require.Equal(t, "off", query(t, srv.URL("postgres"), "SHOW fsync"))
	require.Equal(t, "200", query(t, srv.URL("postgres"), "SHOW max_connections"))

	require.NoError(t, srv.CreateDatabase(ctx, "app"))
	require.NoError(t, srv.CreateDatabase(ctx, "app"), "creating twice is fine")

	conn, err := pgx.Connect(ctx, srv.URL("app"))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('yes')")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	url := srv.URL("app")
	require.NoError(t, srv.Restart(ctx))
	require.Equal(t, url, srv.URL("app"))
	require.Equal(t, "yes", query(t, srv.URL("app"), "SELECT v FROM kept"))

	require.NoError(t, srv.Stop())
	require.NoError(t, srv.Stop(), "stopping twice is fine")
	_, err = pgx.Connect(ctx, srv.URL("app"))
	require.Error(t, err)

	// Start again on an existing cluster.
	srv2, err := localpg.Start(ctx, dir, 0, localpg.Options{Fsync: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv2.Stop() })
	require.Equal(t, "yes", query(t, srv2.URL("app"), "SELECT v FROM kept"))
	require.Equal(t, "on", query(t, srv2.URL("postgres"), "SHOW fsync"))
}

// TestStaleServer simulates a crashed earlier run: a postgres left running on
// the data dir by a dead parent, and a pid file pointing at a reused pid.
func TestStaleServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := dataDir(t)
	srv, err := localpg.Start(ctx, dir, 0, localpg.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	pid := postmasterPID(t, dir)

	// A new Start on the same dir shuts the old server down and takes over.
	srv2, err := localpg.Start(ctx, dir, 0, localpg.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv2.Stop() })
	require.Eventually(t, func() bool { return syscall.Kill(pid, 0) != nil }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, "1", query(t, srv2.URL("postgres"), "SELECT '1'"))
	require.NoError(t, srv2.Stop())

	// A pid file naming some live process that is not our postgres.
	sleeper := exec.Command("sleep", "30")
	require.NoError(t, sleeper.Start())
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	pidFile := filepath.Join(dir, "postmaster.pid")
	require.NoError(t, os.WriteFile(pidFile, []byte(strconv.Itoa(sleeper.Process.Pid)+"\n"+dir+"\n"), 0o600))
	srv3, err := localpg.Start(ctx, dir, 0, localpg.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv3.Stop() })
	require.Equal(t, "1", query(t, srv3.URL("postgres"), "SELECT '1'"))
}

func postmasterPID(t *testing.T, dir string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	require.NoError(t, err)
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(first)
	require.NoError(t, err)
	return pid
}
