package cmdline_test

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/cmdline"
)

// Not parallel: the GC target is process-wide.
func TestTuneGC(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })

	t.Setenv("GOGC", "")
	cmdline.TuneGC()
	require.Equal(t, cmdline.DefaultGCPercent, debug.SetGCPercent(100), "the default without GOGC")

	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150) // as the runtime did at start
	cmdline.TuneGC()
	require.Equal(t, 150, debug.SetGCPercent(100), "GOGC wins")
}
