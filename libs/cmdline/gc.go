package cmdline

import (
	"os"
	"runtime/debug"
)

// DefaultGCPercent is the garbage collector's target (GOGC) a Flo process
// runs with when GOGC is not set. The services keep small live heaps and
// allocate fast (every message decoded, encoded and traced), so at Go's
// default of 100 the collector and the scavenger took a fifth of their CPU;
// at 400 the whole stack moved about 13% more tasks per second on the same
// cores (docs/benchmarks.md). GOMEMLIMIT, when set, still bounds the heap.
const DefaultGCPercent = 400

// TuneGC applies DefaultGCPercent unless GOGC is set, in which case the
// runtime already applied it.
func TuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(DefaultGCPercent)
	}
}
