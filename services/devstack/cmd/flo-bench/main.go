// Command flo-bench measures the whole platform on the embedded stack (kfake
// broker, private Postgres, every service and the SDK in one process). Its
// -mode picks what is measured:
//
//   - actions (the default): invoke through the gateway, the log and the
//     dispatcher, execute in SDK workers over the worker stream, and
//     complete; tasks/s and invoke-to-start latency, at full load and then
//     at half that rate. With -sustain it is a steady rate instead: a
//     backlog kept topped up for a window, then half that rate, then a fixed
//     rate, each with Postgres's commits and CPU, this process's CPU and each
//     dispatcher replica's per task (-dispatchers runs several in-process).
//   - streams: the broker's raw produce and consume rate with a plain
//     franz-go client, then stream appends and group consumption by SDK
//     stream workers on the same broker, in records/s, and our rate as a
//     ratio of the raw one.
//   - workflows: runs of a three-step workflow of trivial actions, runs/s and
//     start-to-complete latency. With -sustain, steady rates as in the
//     actions mode: a backlog of runs kept topped up, then half that rate,
//     then a fixed rate, with the start-to-last-step latency.
//   - plans: runs/s of a one-step workflow whose step is a two-executor plan,
//     beside the same workflow with a plain action step, in one process.
//   - backlog: -tasks tasks invoked with no worker running: the tasks held
//     and cold (past FLO_DISPATCH_QUEUED_TASKS) and the heap they cost once
//     the view has them, then the time a restarted dispatcher takes to start
//     the first of them, and the rate at which workers drain them.
//   - workers: -workers idle SDK workers (action workers, or stream workers
//     with -stream-workers), each on its own connection, in load processes
//     of this binary (-procs) so that file descriptors suffice: time until
//     all are connected and registered, this process's RSS, heap and
//     goroutines after -settle, its and Postgres's CPU over -idle, time for
//     -spread tasks (or records) spread over them, and with -over-limit
//     whether worker N+1 is refused.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/services/devstack"
)

// namespace is where every mode works.
const namespace = "bench"

type options struct {
	mode string
	// token is the key the bench's clients and workers send.
	token string

	// Shared by the modes.
	fsync       bool
	cpuProfile  string
	memProfile  string
	batch       int
	workers     int
	concurrency int

	// actions
	rpc         bool
	tasks       int
	invokers    int
	halfLoadFor time.Duration
	rate        float64
	sustain     time.Duration
	warmup      time.Duration
	backlog     int
	dispatchers int

	// streams
	records    int
	payload    int
	partitions int
	producers  int
	consumers  int

	// workflows
	runs     int
	starters int

	// river
	river string

	// workers
	streamWorkers bool
	procs         int
	settle        time.Duration
	idle          time.Duration
	wait          time.Duration
	spread        int
	overLimit     bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == workersChildFlag {
		if err := runWorkersChild(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "flo-bench load process:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.StringVar(&o.mode, "mode", "actions", "what to measure: actions, streams, workflows, plans, workers, backlog, "+
		"or river (River's own benchmark on a private Postgres like the platform's, for comparison)")
	flag.StringVar(&o.token, "token", "", "the key clients and workers send (FLO_TOKEN); it is also the started stack's admin key "+
		"unless FLO_ADMIN_TOKEN is set; empty uses the stack's own admin key")
	flag.BoolVar(&o.fsync, "fsync", true, "run the private Postgres with fsync on, as a deployment would")
	flag.StringVar(&o.memProfile, "memprofile", "", "write a heap profile to this file (workers: taken after the settle window; "+
		"actions with -sustain: after the full-load phase, whose allocations its alloc_space holds, and FILE.half and FILE.fixed after "+
		"the paced phases, cumulative: pprof -diff_base the one before for a phase's own)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured phase (workers: the idle window; actions with -sustain: the full-load window, and "+
		"FILE.half and FILE.fixed for the paced phases; backlog: the restart and the drain; every service runs in this process) to this file")
	flag.IntVar(&o.batch, "batch", 0, "actions: invoke through InvokeMany with this many tasks per call (0: one unary Invoke per task, "+
		"which the SDK sends together with the calls that overlap it); streams: records per produce, append and stream-worker read (0: 100)")
	flag.BoolVar(&o.rpc, "rpc", false, "actions without -batch: call the gateway's InvokeTask RPC once per task over a plain gRPC connection, "+
		"as a client without the Go SDK does, instead of the SDK's Invoke")
	flag.IntVar(&o.workers, "workers", 2, "actions, workflows, plans: action worker processes (each with its own stream); "+
		"workers: idle workers, each with its own connection")
	flag.IntVar(&o.concurrency, "concurrency", 256, "handler slots per action or stream worker")

	flag.IntVar(&o.tasks, "tasks", 30000, "actions: tasks to invoke in the full-load phase; backlog: tasks to leave queued")
	flag.IntVar(&o.invokers, "invokers", 128, "actions: concurrent invoking goroutines")
	flag.DurationVar(&o.halfLoadFor, "half-load", 10*time.Second, "actions: duration of the half-load latency phase (0 skips it)")
	flag.Float64Var(&o.rate, "rate", 0, "actions: tasks/s of the paced latency phase (0 means half the measured full-load rate); "+
		"with -sustain the fixed rate (tasks/s, workflows: runs/s) of the last phase (0: 1000)")
	flag.DurationVar(&o.sustain, "sustain", 0, "actions, workflows: measure steady rates over windows this long (0: the burst of -tasks or -runs); "+
		"each phase runs -warmup first, not measured, and -half-load 0 skips the paced phases")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Second, "-sustain: the start of each phase, not measured")
	flag.IntVar(&o.backlog, "backlog", 10000, "-sustain: tasks kept invoked and not yet started (workflows: runs started and not yet at their last step) at full load")
	flag.IntVar(&o.dispatchers, "dispatchers", 1, "-sustain: dispatcher replicas in the process, each one's CPU measured")
	flag.StringVar(&o.river, "river", "", "river: River's CLI (`make river` builds it), whose `river bench` runs for -sustain")

	flag.IntVar(&o.records, "records", 100000, "streams: records to produce, append and consume")
	flag.IntVar(&o.payload, "payload", 100, "streams: bytes of each record's payload")
	flag.IntVar(&o.partitions, "partitions", 4, "streams: partitions of the raw topic and of the stream")
	flag.IntVar(&o.producers, "producers", 4, "streams: concurrent producing goroutines, raw and through the SDK alike")
	flag.IntVar(&o.consumers, "consumers", 3, "streams: stream workers in the consumer group")

	flag.IntVar(&o.runs, "runs", 3000, "workflows, plans: runs to start (per phase for plans)")
	flag.IntVar(&o.starters, "starters", 32, "workflows, plans: concurrent starting goroutines (make bench's sustained workflows use 128, "+
		"as many as the actions mode's invokers)")

	flag.BoolVar(&o.streamWorkers, "stream-workers", false, "workers: stream workers of one stream's group instead of action workers of one action")
	flag.IntVar(&o.procs, "procs", 0, "workers: load processes the workers run in (0: as many as hold 5,000 each)")
	flag.DurationVar(&o.settle, "settle", time.Minute, "workers: wait this long after all registered before reading memory")
	flag.DurationVar(&o.idle, "idle", time.Minute, "workers: the window over which idle CPU and Postgres commits are measured")
	flag.DurationVar(&o.wait, "wait", 5*time.Minute, "workers: carry on after this long even if not all workers are connected and registered")
	flag.IntVar(&o.spread, "spread", 1000, "workers: tasks (or records) handed to the idle workers after the idle window")
	flag.BoolVar(&o.overLimit, "over-limit", false, "workers: at the end start worker N+1 and report whether it is refused, "+
		"as it must be when -workers is the namespace's limit (FLO_MAX_WORKERS_PER_NAMESPACE, 10000)")
	flag.Parse()

	modes := map[string]func(context.Context, *platform, options) error{
		"actions":   benchActions,
		"streams":   benchStreams,
		"workflows": benchWorkflows,
		"plans":     benchPlans,
		"workers":   benchWorkers,
		"backlog":   benchBacklog,
	}
	bench, ok := modes[o.mode]
	if !ok && o.mode != "river" {
		fmt.Fprintf(os.Stderr, "flo-bench: unknown -mode %q (actions, streams, workflows, plans, workers, backlog or river)\n", o.mode)
		os.Exit(2)
	}
	if o.dispatchers != 1 && (o.mode != "actions" && o.mode != "workflows" || o.sustain <= 0) || o.dispatchers < 1 {
		fmt.Fprintln(os.Stderr, "flo-bench: -dispatchers takes 1 or more, with -sustain (actions or workflows) only")
		os.Exit(2)
	}
	// Every service runs in this process; tune the collector as their
	// binaries do, each with its own headroom.
	cmdline.TuneGC(slog.New(slog.DiscardHandler), cmdline.AllServices)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := func(ctx context.Context) error { return runPlatform(ctx, o, bench) }
	if o.mode == "river" {
		// River brings its own queue: only its Postgres is started.
		run = func(ctx context.Context) error { return benchRiver(ctx, o) }
	}
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "flo-bench:", err)
		os.Exit(1)
	}
}

// runPlatform runs bench against a platform started for it.
func runPlatform(ctx context.Context, o options, bench func(context.Context, *platform, options) error) error {
	p, err := startPlatform(ctx, o.fsync, o.token)
	if err != nil {
		return err
	}
	defer p.close()
	return bench(ctx, p, o)
}

// platform is the embedded stack, a client of its gateway, and the SDK
// workers a mode runs against it.
type platform struct {
	stack  *devstack.Stack
	client *flo.Client
	// token is the key every client of the bench sends.
	token string
	// log takes warnings and errors of the services and the SDK workers.
	log *slog.Logger

	workerCtx   context.Context
	stopWorkers context.CancelFunc
	workers     sync.WaitGroup
	// cleanup runs in reverse order on close.
	cleanup []func()
}

// startPlatform starts the stack with the defaults of `flo dev`, on private
// ports and a private data dir, and connects a client in the bench namespace
// carrying token (FLO_TOKEN when empty, else the stack's admin key).
func startPlatform(ctx context.Context, fsync bool, token string) (_ *platform, err error) {
	p := &platform{log: slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	p.workerCtx, p.stopWorkers = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	dir, err := privateDir("flo-bench-")
	if err != nil {
		return nil, err
	}
	p.cleanup = append(p.cleanup, func() { os.RemoveAll(dir) })
	var cfg devstack.Config
	if err := config.Load(ctx, &cfg); err != nil {
		return nil, fmt.Errorf("load configuration: %w", err)
	}
	cfg.DataDir = dir
	cfg.PostgresPort, cfg.BrokerPort = 0, 0
	cfg.OnEphemeralPorts()
	cfg.Namespaces = []string{namespace}
	cfg.PostgresFsync = fsync
	if token == "" {
		var env struct {
			Token string `env:"FLO_TOKEN"`
		}
		if err := config.Load(ctx, &env); err != nil {
			return nil, fmt.Errorf("load configuration: %w", err)
		}
		token = env.Token
	}
	// The bench's stack is its own: a key the caller brings is its admin
	// key, unless FLO_ADMIN_TOKEN names one.
	if cfg.AdminToken == "" {
		cfg.AdminToken = token
	}
	if p.stack, err = devstack.Start(ctx, cfg, p.log); err != nil {
		return nil, err
	}
	p.token = p.stack.AdminToken()
	if token != "" {
		p.token = token
	}
	p.cleanup = append(p.cleanup, p.stack.Stop)
	if p.client, err = p.connect(); err != nil {
		return nil, err
	}
	return p, nil
}

// privateDir makes a temporary directory for a private Postgres's data.
func privateDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", fmt.Errorf("temp dir: %w", err)
	}
	// The private Postgres runs as an unprivileged user when we are root; it
	// must be able to enter the directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("temp dir: %w", err)
	}
	return dir, nil
}

// connect returns a new client of the gateway, closed with the platform: each
// worker gets its own, as separate worker processes would.
func (p *platform) connect() (*flo.Client, error) {
	c := flo.NewClient(p.stack.GatewayGRPCAddr(), flo.WithNamespace(namespace), flo.WithToken(p.token))
	if err := c.Connect(); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	p.cleanup = append(p.cleanup, func() { c.Close() })
	return c, nil
}

// starter is an SDK worker: an ActionWorker or a StreamWorker.
type starter interface {
	Start(ctx context.Context) error
}

// runWorker runs w until the platform closes. A worker that cannot run is
// reported at once: the measurement would wait for it forever.
func (p *platform) runWorker(w starter) {
	p.workers.Go(func() {
		err := w.Start(p.workerCtx)
		if err != nil && !errors.Is(err, context.Canceled) {
			p.log.Error("worker stopped", "error", err)
		}
	})
}

// actionHandler is an SDK action handler.
type actionHandler = func(*flo.ActionContext) ([]byte, error)

// serveActions registers the actions of handlers and runs o.workers action
// workers of o.concurrency slots that serve them.
func (p *platform) serveActions(ctx context.Context, o options, handlers map[string]actionHandler) error {
	for name := range handlers {
		if err := p.registerAction(ctx, name); err != nil {
			return err
		}
	}
	return p.startWorkers(o, handlers)
}

// registerAction registers the action name as the bench's workers serve it.
func (p *platform) registerAction(ctx context.Context, name string) error {
	if _, err := p.client.RegisterAction(ctx, name, flo.ActionOptions{Timeout: time.Minute, MaxAttempts: 3}); err != nil {
		return fmt.Errorf("register action %s: %w", name, err)
	}
	return nil
}

// startWorkers runs o.workers action workers of o.concurrency slots that
// serve handlers' actions, registered already.
func (p *platform) startWorkers(o options, handlers map[string]actionHandler) error {
	for range o.workers {
		c, err := p.connect()
		if err != nil {
			return err
		}
		w, err := c.NewActionWorker(flo.ActionWorkerOptions{Concurrency: o.concurrency, Logger: p.log})
		if err != nil {
			return fmt.Errorf("new worker: %w", err)
		}
		for name, h := range handlers {
			w.MustRegisterAction(name, h)
		}
		p.runWorker(w)
	}
	return nil
}

// openDB connects to the stack's Postgres, closed with the platform.
func (p *platform) openDB(ctx context.Context) (*pgx.Conn, error) {
	db, err := pgx.Connect(ctx, p.stack.DatabaseURL())
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	p.cleanup = append(p.cleanup, func() { db.Close(context.Background()) })
	return db, nil
}

func (p *platform) close() {
	// Workers stop (and deregister) before their clients close.
	p.stopWorkers()
	p.workers.Wait()
	for _, f := range slices.Backward(p.cleanup) {
		f()
	}
}

// profile writes a CPU profile to path until the returned stop is called;
// an empty path profiles nothing.
func profile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// chunks runs n goroutines that together call fn for consecutive chunks of
// [0, total), each at most size long.
func chunks(n, total, size int, fn func(lo, hi int) error) error {
	var next atomic.Int64
	var g errgroup.Group
	for range n {
		g.Go(func() error {
			for {
				hi := int(next.Add(int64(size)))
				lo := hi - size
				if lo >= total {
					return nil
				}
				if err := fn(lo, min(hi, total)); err != nil {
					return err
				}
			}
		})
	}
	return g.Wait()
}

// perSecond is n over d.
func perSecond(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// latencies collects latency samples in microseconds.
type latencies struct {
	mu      sync.Mutex
	samples []int64
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.samples = append(l.samples, d.Microseconds())
	l.mu.Unlock()
}

func (l *latencies) reset() {
	l.mu.Lock()
	l.samples = l.samples[:0]
	l.mu.Unlock()
}

func (l *latencies) percentiles() (p50, p99 time.Duration, n int) {
	l.mu.Lock()
	s := slices.Clone(l.samples)
	l.mu.Unlock()
	if len(s) == 0 {
		return 0, 0, 0
	}
	slices.Sort(s)
	at := func(q float64) time.Duration { return time.Duration(s[int(q*float64(len(s)-1))]) * time.Microsecond }
	return at(0.50), at(0.99), len(s)
}

// waitFor calls done every 20 ms until it reports n >= want, printing
// progress every two seconds: a measurement loop in a benchmark tool, not
// part of the platform.
func waitFor(ctx context.Context, start time.Time, what string, done func() (n, want int, err error)) error {
	last := time.Now()
	for {
		n, want, err := done()
		if err != nil {
			return err
		}
		if n >= want {
			return nil
		}
		if time.Since(last) > 2*time.Second {
			fmt.Printf("  ... %d/%d %s after %v\n", n, want, what, time.Since(start).Round(time.Second))
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
