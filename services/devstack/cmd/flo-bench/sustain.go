package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/config"
	dispatcher "github.com/razorbill/flo/services/dispatcher/service"
)

// sustained is the state of a sustained mode (actions or workflows) across
// its phases.
type sustained struct {
	p  *platform
	o  options
	w  workload
	db *pgx.Conn
	// bound is the dispatcher's FLO_DISPATCH_QUEUED_TASKS.
	bound int
	// pgPID is the private Postgres's postmaster, 0 when it is not on this
	// machine (then its CPU is not reported).
	pgPID int

	invoked atomic.Int64 // units invoked (tasks) or started (runs), every phase
	started atomic.Int64 // units that arrived at the measured handler, every phase
	// ahead holds a token for each unit invoked and not yet arrived while
	// the full-load phase runs: callers put them, arrivals take them.
	ahead  atomic.Pointer[chan struct{}]
	stamps stamps
	begin  time.Time
}

// workload is what a sustained mode drives: tasks of the bench action, or
// runs of the bench workflow, each counted when it arrives at the handler
// that measures it (the action's, or the workflow's last step's).
type workload struct {
	// unit names what is counted: "tasks" or "runs".
	unit string
	// latency names what the stamps measure, from the call to the arrival.
	latency string
	// tasks is how many tasks each unit completes.
	tasks int
	// callers is how many goroutines invoke (or start).
	callers int
	inv     *invoker
}

// arrived counts a unit at its measured handler: invokedAt (Unix
// nanoseconds) is when its call was made, now when the handler started.
func (s *sustained) arrived(invokedAt int64, now time.Time) {
	s.started.Add(1)
	if ahead := s.ahead.Load(); ahead != nil {
		select {
		case <-*ahead:
		default:
		}
	}
	s.stamps.add(invokedAt, now.UnixNano())
}

// phase is one row of the sustained mode's table.
type phase struct {
	name    string
	from    time.Time // the window
	to      time.Time
	rate    float64 // arrivals per second in the window
	p50     time.Duration
	p90     time.Duration
	p99     time.Duration
	commits float64       // Postgres commits per second
	pgCPU   time.Duration // Postgres CPU in the window, -1 when unknown
	cpu     time.Duration // this process's CPU in the window
	worked  int64         // units that arrived in the window
	// replicas is the CPU of each dispatcher replica in the window, by
	// replica number.
	replicas map[string]time.Duration
	// requests is what the embedded broker handled in the window by kind;
	// nil with an external broker.
	requests map[string]int64
	// allocated and collections are the process's heap bytes allocated and
	// garbage collections in the window.
	allocated, collections uint64
	// mostHeld is the most queued tasks one partition held in memory at
	// any of the window's samples of the dispatcher's gauge.
	mostHeld int
}

// benchSustained runs the actions mode for a steady rate (runSustained):
// tasks of one action, each stamped when invoked and measured when its
// handler starts.
func benchSustained(ctx context.Context, p *platform, o options) error {
	return runSustained(ctx, p, o, func(s *sustained) (workload, error) {
		err := p.serveActions(ctx, o, map[string]actionHandler{
			"bench": func(actx *flo.ActionContext) ([]byte, error) {
				now := time.Now()
				var pl actionPayload
				if err := actx.Into(&pl); err != nil {
					return nil, flo.NewNonRetryableErrorf("bad payload: %v", err)
				}
				s.arrived(pl.InvokedAt, now)
				return nil, nil
			},
		})
		if err != nil {
			return workload{}, err
		}
		inv, err := p.newInvoker(o)
		if err != nil {
			return workload{}, err
		}
		return workload{unit: "tasks", latency: "invoke-to-start", tasks: 1, callers: o.invokers, inv: inv}, nil
	})
}

// runSustained measures a steady rate of the workload setup returns: first
// at full load, calling for o.warmup+o.sustain while keeping o.backlog units
// called and not yet arrived (as `river bench` keeps its queue filled), then
// paced at half the rate measured, then at a fixed rate (o.rate, 1,000/s
// when 0). Each phase measures its last o.sustain only and waits until every
// task called so far is completed before the next begins.
func runSustained(ctx context.Context, p *platform, o options, setup func(*sustained) (workload, error)) error {
	s := &sustained{p: p, o: o, begin: time.Now()}
	var dcfg dispatcher.Config
	if err := config.Load(ctx, &dcfg); err != nil {
		return fmt.Errorf("load the dispatcher's configuration: %w", err)
	}
	s.bound = dcfg.QueuedTasks
	if b := p.stack.Broker(); b != nil {
		b.CountRequests()
	}
	if err := s.startDispatchers(ctx); err != nil {
		return err
	}
	var err error
	if s.w, err = setup(s); err != nil {
		return err
	}
	if s.db, err = p.openDB(ctx); err != nil {
		return err
	}
	if s.pgPID, err = postmaster(ctx, s.db); err != nil {
		return err
	}
	fmt.Printf("sustained: %d callers (%s), backlog %d %s, %d workers x %d slots, %d dispatcher replica(s), fsync=%v; "+
		"each phase runs %v and measures its last %v\n",
		s.w.callers, s.w.inv.mode, o.backlog, s.w.unit, o.workers, o.concurrency, o.dispatchers, o.fsync, o.warmup+o.sustain, o.sustain)

	full, err := s.phase(ctx, fmt.Sprintf("full load, backlog %d", o.backlog), o.cpuProfile, s.topUp)
	if err != nil {
		return err
	}
	// Its alloc_space is what the process allocated up to the end of the
	// full load, mostly during it.
	if err := heapProfile(o.memProfile); err != nil {
		return err
	}
	rows := []phase{full}
	if o.halfLoadFor > 0 {
		fixed := o.rate
		if fixed <= 0 {
			fixed = 1000
		}
		for _, pc := range []struct {
			name string
			rate float64
			file string
		}{{"half rate", full.rate / 2, "half"}, {"fixed rate", fixed, "fixed"}} {
			name := fmt.Sprintf("%s, %.0f %s/s", pc.name, pc.rate, s.w.unit)
			profile := ""
			if o.cpuProfile != "" {
				profile = o.cpuProfile + "." + pc.file
			}
			row, err := s.phase(ctx, name, profile, func(ctx context.Context, d time.Duration) (int, error) {
				return paced(ctx, s.w.inv, pc.rate, d, s.w.callers)
			})
			if err != nil {
				return err
			}
			if o.memProfile != "" {
				// Cumulative: take the profile before it as -diff_base to
				// see what this phase allocated.
				if err := heapProfile(o.memProfile + "." + pc.file); err != nil {
					return err
				}
			}
			rows = append(rows, row)
		}
	}
	s.print(rows)
	return nil
}

// startDispatchers restarts the stack's dispatcher under the pprof label
// dispatcher=1 and starts replicas 2..o.dispatchers under theirs, so a CPU
// profile can tell each replica's share: every goroutine a replica starts
// inherits its label. Work of the Go runtime's background GC and of shared
// telemetry exporters carries no label and is counted for none.
func (s *sustained) startDispatchers(ctx context.Context) error {
	if err := s.p.stack.StopDispatcher(); err != nil {
		return err
	}
	for i := 1; i <= s.o.dispatchers; i++ {
		var err error
		pprof.Do(ctx, pprof.Labels(replicaLabel, strconv.Itoa(i)), func(ctx context.Context) {
			if i == 1 {
				err = s.p.stack.StartDispatcher(ctx)
			} else {
				err = s.p.stack.StartDispatcherReplica(ctx, fmt.Sprintf("dispatcher-%d", i))
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// phase runs load for o.warmup+o.sustain, measures the last o.sustain and
// waits until every task invoked so far is completed. A non-empty
// profilePath gets the window's CPU profile.
func (s *sustained) phase(ctx context.Context, name, profilePath string, load func(context.Context, time.Duration) (int, error)) (phase, error) {
	s.stamps.reset()
	var g errgroup.Group
	g.Go(func() error {
		n, err := load(ctx, s.o.warmup+s.o.sustain)
		s.invoked.Add(int64(n))
		return err
	})
	row, prof, err := s.measure(ctx, name)
	if err != nil {
		return phase{}, err
	}
	if profilePath != "" {
		if err := os.WriteFile(profilePath, prof, 0o644); err != nil {
			return phase{}, fmt.Errorf("cpu profile: %w", err)
		}
	}
	if err := g.Wait(); err != nil {
		return phase{}, err
	}
	if err := waitCompleted(ctx, s.db, int(s.invoked.Load())*s.w.tasks, s.begin); err != nil {
		return phase{}, err
	}
	// Now that every task invoked in the window has started, the backlog's
	// last included.
	row.p50, row.p90, row.p99 = s.stamps.percentiles(row.from, row.to)
	fmt.Printf("  %s: %.0f %s/s; all %d %s called so far completed %v after the start\n",
		name, row.rate, s.w.unit, s.invoked.Load(), s.w.unit, time.Since(s.begin).Round(time.Second))
	return row, nil
}

// measure waits out the warm-up and reads the counters and a CPU profile
// around the window.
func (s *sustained) measure(ctx context.Context, name string) (phase, []byte, error) {
	if err := sleep(ctx, s.o.warmup); err != nil {
		return phase{}, nil, err
	}
	before, err := s.read(ctx)
	if err != nil {
		return phase{}, nil, err
	}
	stop, err := recordProfile()
	if err != nil {
		return phase{}, nil, err
	}
	mostHeld, err := s.mostHeld(ctx, s.o.sustain)
	prof := stop()
	if err != nil {
		return phase{}, nil, err
	}
	after, err := s.read(ctx)
	if err != nil {
		return phase{}, nil, err
	}
	window := after.at.Sub(before.at)
	used := after.usage.sub(before.usage)
	row := phase{
		name:        name,
		from:        before.at,
		to:          after.at,
		worked:      after.started - before.started,
		commits:     perSecond(int(used.commits), window),
		pgCPU:       used.pgCPU,
		cpu:         used.cpu,
		allocated:   used.allocated,
		collections: used.collections,
		mostHeld:    mostHeld,
	}
	row.rate = perSecond(int(row.worked), window)
	if before.requests != nil {
		row.requests = map[string]int64{}
		for k, n := range after.requests {
			if d := n - before.requests[k]; d > 0 {
				row.requests[k] = d
			}
		}
	}
	if row.replicas, err = cpuByLabel(prof, replicaLabel); err != nil {
		return phase{}, nil, err
	}
	return row, prof, nil
}

// heldSample is how often mostHeld reads the dispatcher's gauge.
const heldSample = 250 * time.Millisecond

// mostHeld reads the dispatcher's queued-task gauge every heldSample for d
// and returns the most queued tasks one partition held in memory: past
// FLO_DISPATCH_QUEUED_TASKS by at most what arrives within the view's lag.
func (s *sustained) mostHeld(ctx context.Context, d time.Duration) (int, error) {
	tick := time.NewTicker(heldSample)
	defer tick.Stop()
	end := time.After(d)
	most := 0
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-end:
			return most, nil
		case <-tick.C:
			_, _, n, err := queuedTasks(ctx, s.p.stack.GatewayMetricsAddr())
			if err != nil {
				return 0, err
			}
			most = max(most, n)
		}
	}
}

// reading is the counters at one moment.
type reading struct {
	at      time.Time
	started int64
	usage
	// requests is the embedded broker's count by kind, nil without one.
	requests map[string]int64
}

func (s *sustained) read(ctx context.Context) (reading, error) {
	r := reading{at: time.Now(), started: s.started.Load()}
	if b := s.p.stack.Broker(); b != nil {
		r.requests = b.Requests()
	}
	var err error
	if r.usage, err = readUsage(ctx, s.db, s.pgPID); err != nil {
		return reading{}, err
	}
	return r, nil
}

// topUp calls for d with the workload's callers, each calling again as
// soon as fewer than o.backlog units are called and not yet arrived; it
// returns how many it called.
func (s *sustained) topUp(ctx context.Context, d time.Duration) (int, error) {
	per := s.w.inv.per
	ahead := make(chan struct{}, s.o.backlog)
	s.ahead.Store(&ahead)
	defer s.ahead.Store(nil)
	// The last invokes finish on ctx: only waiting for room ends at d.
	until, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var n atomic.Int64
	var g errgroup.Group
	for range s.w.callers {
		g.Go(func() error {
			for {
				for range per {
					select {
					case ahead <- struct{}{}:
					case <-until.Done():
						return nil
					}
				}
				if err := s.w.inv.invoke(ctx, per); err != nil {
					return err
				}
				n.Add(int64(per))
			}
		})
	}
	err := g.Wait()
	return int(n.Load()), err
}

// print writes the phases as a Markdown table.
func (s *sustained) print(rows []phase) {
	fmt.Println()
	u := strings.TrimSuffix(s.w.unit, "s")
	fmt.Printf("| phase | %s/s | %s p50 / p90 / p99 ms | Postgres commits/s | Postgres CPU ms per 1k %s | process CPU ms per 1k %s | dispatcher CPU ms per 1k %s | broker requests per %s | broker transactions/s |\n",
		s.w.unit, s.w.latency, s.w.unit, s.w.unit, s.w.unit, u)
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		var replicas []string
		for i := 1; i <= s.o.dispatchers; i++ {
			id := strconv.Itoa(i)
			replicas = append(replicas, id+": "+perThousand(r.replicas[id], r.worked))
		}
		perTask, txns := "n/a", "n/a"
		if r.requests != nil && r.worked > 0 {
			var total int64
			for _, n := range r.requests {
				total += n
			}
			perTask = fmt.Sprintf("%.2f", float64(total)/float64(r.worked))
			txns = fmt.Sprintf("%.0f", perSecond(int(r.requests["EndTxn"]), r.to.Sub(r.from)))
		}
		fmt.Printf("| %s | %.0f | %s / %s / %s | %.0f | %s | %s | %s | %s | %s |\n", r.name, r.rate, ms(r.p50), ms(r.p90), ms(r.p99),
			r.commits, perThousand(r.pgCPU, r.worked), perThousand(r.cpu, r.worked), strings.Join(replicas, ", "), perTask, txns)
	}
	fmt.Println()
	for _, r := range rows {
		if kinds := requestsPer(r.requests, r.worked); kinds != "" {
			fmt.Printf("broker requests per %s, %s: %s\n", u, r.name, kinds)
		}
	}
	for _, r := range rows {
		if r.worked > 0 {
			fmt.Printf("heap allocated per %s, %s: %.1f KB; collections: %.1f/s\n", u, r.name,
				float64(r.allocated)/float64(r.worked)/1000, perSecond(int(r.collections), r.to.Sub(r.from)))
		}
	}
	for _, r := range rows {
		fmt.Printf("most queued tasks one partition held, %s: %d (FLO_DISPATCH_QUEUED_TASKS %d)\n", r.name, r.mostHeld, s.bound)
	}
}

// requestsPer lists the kinds of requests by how many each unit worked (a
// task, a run) cost, most first, leaving out those below 0.01 per unit.
func requestsPer(requests map[string]int64, worked int64) string {
	if worked == 0 {
		return ""
	}
	kinds := slices.SortedFunc(maps.Keys(requests), func(a, b string) int {
		return cmp.Or(cmp.Compare(requests[b], requests[a]), cmp.Compare(a, b))
	})
	var out []string
	for _, k := range kinds {
		if per := float64(requests[k]) / float64(worked); per >= 0.01 {
			out = append(out, fmt.Sprintf("%s %.2f", k, per))
		}
	}
	return strings.Join(out, ", ")
}

// perThousand is d in milliseconds per 1,000 of n (tasks, jobs), "n/a"
// when it cannot be told.
func perThousand(d time.Duration, n int64) string {
	if d < 0 || n == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000/(float64(n)/1000))
}

// ms formats d in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }

// stamps collects, for each handler start, when the task was invoked and
// when its handler started, in Unix nanoseconds.
type stamps struct {
	mu      sync.Mutex
	invoked []int64
	start   []int64
}

func (s *stamps) add(invoked, start int64) {
	s.mu.Lock()
	s.invoked = append(s.invoked, invoked)
	s.start = append(s.start, start)
	s.mu.Unlock()
}

func (s *stamps) reset() {
	s.mu.Lock()
	s.invoked, s.start = s.invoked[:0], s.start[:0]
	s.mu.Unlock()
}

// percentiles of the latency of the units called in [from, to).
func (s *stamps) percentiles(from, to time.Time) (p50, p90, p99 time.Duration) {
	lo, hi := from.UnixNano(), to.UnixNano()
	s.mu.Lock()
	var lat []int64
	for i, at := range s.invoked {
		if at >= lo && at < hi {
			lat = append(lat, s.start[i]-at)
		}
	}
	s.mu.Unlock()
	if len(lat) == 0 {
		return 0, 0, 0
	}
	slices.Sort(lat)
	at := func(q float64) time.Duration { return time.Duration(lat[int(q*float64(len(lat)-1))]) }
	return at(0.50), at(0.90), at(0.99)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
