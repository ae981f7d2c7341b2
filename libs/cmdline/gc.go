package cmdline

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// DefaultGCPercent is the garbage collector's target (GOGC) a Flo process
// runs with when GOGC is not set. The services keep small live heaps and
// allocate fast (every message decoded, encoded and traced), so at Go's
// default of 100 the collector and the scavenger took a fifth of their CPU;
// at 400 the whole stack moved 10-13% more work on the same cores
// (docs/benchmarks.md).
const DefaultGCPercent = 400

// MaxHeadroom caps how far past its live heap the collector lets a service's
// heap grow when GOGC is not set. DefaultGCPercent pays off while the live
// heap is small; a process that holds much (10,000 idle worker connections
// hold some 300 MiB) would otherwise grow to five times that for nothing.
const MaxHeadroom = 256 << 20

// AllServices is how many services `flo dev` and flo-bench run in their one
// process (TuneGC).
const AllServices = 5

// minGCPercent is the lowest target the headroom cap sets: below it the
// collector would run too often for a busy process with a large live heap.
const minGCPercent = 50

// GCPercentFor is the target that keeps the headroom of a heap with live
// bytes, of a process running services services, under MaxHeadroom for
// each: for one, DefaultGCPercent up to 64 MiB live, less above, never under
// minGCPercent.
func GCPercentFor(live uint64, services int) int {
	if live == 0 {
		return DefaultGCPercent
	}
	return int(min(DefaultGCPercent, max(minGCPercent, uint64(services)*MaxHeadroom*100/live)))
}

// memoryLimitRatio is the share of a container's memory limit the heap is
// held under (GOMEMLIMIT) when GOMEMLIMIT is not set, leaving the rest for
// what the Go runtime does not count.
const memoryLimitRatio = 0.9

// TuneGC applies DefaultGCPercent unless GOGC is set, and, unless
// GOMEMLIMIT is set, a soft memory limit of 90% of the cgroup's memory
// limit (a container's), so the higher target cannot grow the heap into an
// out-of-memory kill: the collector works harder as the heap nears the
// limit. It logs what it set. services is how many services the process
// runs: 1 for a service's binary, AllServices for `flo dev` and flo-bench,
// whose one heap holds what five processes would, each with its own
// headroom.
func TuneGC(log *slog.Logger, services int) {
	gogc := os.Getenv("GOGC")
	capping.Store(gogc == "")
	services = max(services, 1)
	sharedBy.Store(int64(services))
	if gogc == "" {
		debug.SetGCPercent(DefaultGCPercent)
		gogc = fmt.Sprintf("400 (default, less past %d MiB live)", services*MaxHeadroom*100/DefaultGCPercent>>20)
		startCapOnce()
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

// capping says the headroom cap adjusts the target after each collection;
// it is off when GOGC is set.
var capping atomic.Bool

// sharedBy is the services argument of the last TuneGC.
var sharedBy atomic.Int64

// startCapOnce starts the headroom cap, once per process.
var startCapOnce = sync.OnceFunc(func() {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	current := DefaultGCPercent
	var after func()
	after = func() {
		if capping.Load() {
			metrics.Read(sample)
			// Only a change of a tenth or more: setting the target stops
			// the world for a moment.
			if p := GCPercentFor(sample[0].Value.Uint64(), int(sharedBy.Load())); p*10 < current*9 || p*10 > current*11 {
				current = p
				debug.SetGCPercent(p)
			}
		}
		afterNextGC(after)
	}
	afterNextGC(after)
})

// gcSentinel is an object made only to be collected; the pointer keeps it
// out of the tiny allocator, whose blocks would outlive it.
type gcSentinel struct{ _ *int }

// afterNextGC runs fn once after the next collection, on the runtime's
// cleanup goroutine.
func afterNextGC(fn func()) {
	runtime.AddCleanup(&gcSentinel{}, func(struct{}) { fn() }, struct{}{})
}
