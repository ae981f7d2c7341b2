package cmdline_test

import (
	"log/slog"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/cmdline"
)

// Not parallel: the GC target and memory limit are process-wide.
func TestTuneGC(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	gc, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	t.Cleanup(func() {
		debug.SetGCPercent(gc)
		debug.SetMemoryLimit(limit)
	})

	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "1GiB") // set: left to the runtime
	debug.SetMemoryLimit(1 << 30)
	cmdline.TuneGC(quiet)
	require.Equal(t, cmdline.DefaultGCPercent, debug.SetGCPercent(100), "the default without GOGC")
	require.Equal(t, int64(1<<30), debug.SetMemoryLimit(-1), "GOMEMLIMIT wins")

	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150) // as the runtime did at start
	cmdline.TuneGC(quiet)
	require.Equal(t, 150, debug.SetGCPercent(100), "GOGC wins")
}
