package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
)

// TestDevPrintsTheAdminKeyItKeeps: `flo dev` with no FLO_ADMIN_TOKEN makes an
// admin key in its data dir (owner-only), prints it with the export line for
// FLO_TOKEN, and a second start prints the same key. Not parallel: it sets
// the stack's variables.
func TestDevPrintsTheAdminKeyItKeeps(t *testing.T) {
	broker := harness.NewBroker(t)
	t.Setenv("FLO_DATABASE_URL", harness.NewDatabase(t))
	t.Setenv("FLO_KAFKA_BROKERS", strings.Join(broker.Addrs(), ","))
	t.Setenv("FLO_ADMIN_TOKEN", "")
	t.Setenv("FLO_LOG_LEVEL", "warn")
	for _, svc := range []string{"GATEWAY", "DISPATCHER", "REGISTRY", "STREAMS", "WORKFLOW"} {
		t.Setenv("FLO_"+svc+"_GRPC_ADDR", "127.0.0.1:0")
		t.Setenv("FLO_"+svc+"_HTTP_ADDR", "127.0.0.1:0")
	}
	t.Setenv("FLO_GATEWAY_METRICS_ADDR", "127.0.0.1:0")
	dir := t.TempDir()
	keyLine := regexp.MustCompile(`(?m)^  admin key +(flo_admin_[0-9a-f]{64})$`)

	dev := func() string {
		ctx, cancel := context.WithCancel(context.Background())
		var out, errOut harness.Buffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, []string{"dev", "--data-dir", dir}, strings.NewReader(""), &out, &errOut) }()
		require.Eventually(t, func() bool {
			select {
			case code := <-done:
				t.Fatalf("flo dev exited with %d: %s", code, errOut.String())
			default:
			}
			return strings.Contains(out.String(), "Press ctrl-C to stop.")
		}, time.Minute, 20*time.Millisecond)
		cancel()
		require.Equal(t, 0, <-done, errOut.String())
		m := keyLine.FindStringSubmatch(out.String())
		require.NotNil(t, m, out.String())
		require.Contains(t, out.String(), "\n  export FLO_TOKEN="+m[1]+"\n")
		return m[1]
	}

	key := dev()
	info, err := os.Stat(filepath.Join(dir, "admin-token"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	require.Equal(t, key, dev(), "a restart keeps the key")
}
