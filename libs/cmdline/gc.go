package cmdline

import (
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// DefaultGCPercent is the garbage collector's target (GOGC) a Flo process
// runs with when GOGC is not set. The services keep small live heaps and
// allocate fast (every message decoded, encoded and traced), so at Go's
// default of 100 the collector and the scavenger took a fifth of their CPU;
// at 400 the whole stack moved 10-13% more work on the same cores
// (docs/benchmarks.md).
const DefaultGCPercent = 400

// memoryLimitRatio is the share of a container's memory limit the heap is
// held under (GOMEMLIMIT) when GOMEMLIMIT is not set, leaving the rest for
// what the Go runtime does not count.
const memoryLimitRatio = 0.9

// TuneGC applies DefaultGCPercent unless GOGC is set, and, unless
// GOMEMLIMIT is set, a soft memory limit of 90% of the cgroup's memory
// limit (a container's), so the higher target cannot grow the heap into an
// out-of-memory kill: the collector works harder as the heap nears the
// limit. It logs what it set.
func TuneGC(log *slog.Logger) {
	gogc := os.Getenv("GOGC")
	if gogc == "" {
		debug.SetGCPercent(DefaultGCPercent)
		gogc = "400 (default)"
	}
	limit, err := memlimit.SetGoMemLimitWithOpts(memlimit.WithRatio(memoryLimitRatio), memlimit.WithProvider(memlimit.FromCgroup))
	switch {
	case err != nil:
		// No cgroup (a laptop, another OS): nothing to hold the heap under.
		log.Debug("no container memory limit found", "GOGC", gogc, "error", err)
	case limit > 0:
		log.Info("garbage collector tuned", "GOGC", gogc, "GOMEMLIMIT", limit)
	default:
		log.Debug("garbage collector tuned", "GOGC", gogc, "GOMEMLIMIT", os.Getenv("GOMEMLIMIT"))
	}
}
