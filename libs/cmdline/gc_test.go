package cmdline_test

import (
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

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
	cmdline.TuneGC(quiet, 1)
	require.Equal(t, cmdline.DefaultGCPercent, debug.SetGCPercent(100), "the default without GOGC")
	require.Equal(t, int64(1<<30), debug.SetMemoryLimit(-1), "GOMEMLIMIT wins")

	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150) // as the runtime did at start
	cmdline.TuneGC(quiet, 1)
	require.Equal(t, 150, debug.SetGCPercent(100), "GOGC wins")
}

func TestGCPercentFor(t *testing.T) {
	for _, c := range []struct {
		live     uint64
		services int
		want     int
	}{
		{0, 1, cmdline.DefaultGCPercent},
		{10 << 20, 1, cmdline.DefaultGCPercent},
		{64 << 20, 1, cmdline.DefaultGCPercent},
		{128 << 20, 1, 200},
		{256 << 20, 1, 100},
		{512 << 20, 1, 50},
		{4 << 30, 1, 50},
		// Five services in one process: the headroom of five.
		{128 << 20, cmdline.AllServices, cmdline.DefaultGCPercent},
		{320 << 20, cmdline.AllServices, cmdline.DefaultGCPercent},
		{1280 << 20, cmdline.AllServices, 100},
	} {
		require.Equal(t, c.want, cmdline.GCPercentFor(c.live, c.services), "live %d MiB, %d services", c.live>>20, c.services)
	}
}

// Not parallel: the GC target is process-wide.
func TestTuneGCCapsTheHeadroomOfALargeLiveHeap(t *testing.T) {
	gc := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(gc) })
	t.Setenv("GOGC", "")
	// What an earlier test left live is collected first: the cap reads the
	// live heap of the last collection.
	runtime.GC()
	cmdline.TuneGC(slog.New(slog.DiscardHandler), 1)
	require.Equal(t, cmdline.DefaultGCPercent, gogc())

	// 192 MiB live: the target falls so that the heap grows at most
	// MaxHeadroom past it.
	live := make([][]byte, 192)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	require.Eventually(t, func() bool {
		runtime.GC()
		return gogc() < 150
	}, 10*time.Second, 10*time.Millisecond, "the target after collections with 192 MiB live")
	require.GreaterOrEqual(t, gogc(), 100)
	runtime.KeepAlive(live)

	// Let go of it: the target goes back up.
	live = nil
	require.Eventually(t, func() bool {
		runtime.GC()
		return gogc() == cmdline.DefaultGCPercent
	}, 10*time.Second, 10*time.Millisecond, "the target once the heap is small again")

	// Two services in the process: twice the headroom, so a higher target
	// for as much live.
	cmdline.TuneGC(slog.New(slog.DiscardHandler), 2)
	shared := make([][]byte, 192)
	for i := range shared {
		shared[i] = make([]byte, 1<<20)
	}
	require.Eventually(t, func() bool {
		runtime.GC()
		return gogc() > 200 && gogc() < 300
	}, 10*time.Second, 10*time.Millisecond, "the target of two services after collections with 192 MiB live")
	runtime.KeepAlive(shared)

	// GOGC set: the cap leaves the target alone.
	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150)
	cmdline.TuneGC(slog.New(slog.DiscardHandler), 1)
	big := make([][]byte, 192)
	for i := range big {
		big[i] = make([]byte, 1<<20)
	}
	for range 3 {
		runtime.GC()
	}
	require.Equal(t, 150, gogc(), "GOGC wins over the cap")
	runtime.KeepAlive(big)
}

// gogc reads the collector's target without changing it.
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}
