// Command flo-bench measures the action path on the whole embedded stack:
// invoke through the gateway, the log and the dispatcher, execute in SDK
// workers over the worker stream, and complete. It prints tasks/s and
// invoke-to-start latency, first at full load and then at half that rate.
package main

import (
	"context"
	"encoding/json"
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
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/services/devstack"
)

type options struct {
	tasks       int
	invokers    int
	workers     int
	concurrency int
	halfLoadFor time.Duration
	fsync       bool
	cpuProfile  string
	batch       int
	rate        float64
}

func main() {
	var o options
	flag.IntVar(&o.tasks, "tasks", 30000, "tasks to invoke in the full-load phase")
	flag.IntVar(&o.invokers, "invokers", 128, "concurrent invoking goroutines")
	flag.IntVar(&o.workers, "workers", 2, "worker processes (each with its own stream)")
	flag.IntVar(&o.concurrency, "concurrency", 256, "handler slots per worker")
	flag.DurationVar(&o.halfLoadFor, "half-load", 10*time.Second, "duration of the half-load latency phase (0 skips it)")
	flag.BoolVar(&o.fsync, "fsync", true, "run the private Postgres with fsync on, as a deployment would")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the full-load phase (every service runs in this process) to this file")
	flag.IntVar(&o.batch, "batch", 0, "invoke through InvokeMany with this many tasks per call (0: one unary Invoke per task)")
	flag.Float64Var(&o.rate, "rate", 0, "tasks/s of the paced latency phase (0 means half the measured full-load rate)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "flo-bench:", err)
		os.Exit(1)
	}
}

// latencies collects invoke-to-start samples in microseconds.
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

type payload struct {
	InvokedAt int64 `json:"t"`
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "flo-bench-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	// The private Postgres runs as an unprivileged user when we are root; it
	// must be able to enter the directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The defaults of `flo dev`, on private ports and a private data dir.
	var cfg devstack.Config
	if err := config.Load(ctx, &cfg); err != nil {
		return fmt.Errorf("load configuration: %w", err)
	}
	cfg.DataDir = dir
	cfg.PostgresPort, cfg.BrokerPort = 0, 0
	for _, addr := range []*string{&cfg.GatewayGRPCAddr, &cfg.GatewayHTTPAddr, &cfg.DispatcherGRPCAddr,
		&cfg.DispatcherHTTPAddr, &cfg.RegistryGRPCAddr, &cfg.RegistryHTTPAddr} {
		*addr = "127.0.0.1:0"
	}
	cfg.Namespaces = []string{"bench"}
	cfg.PostgresFsync = o.fsync
	stack, err := devstack.Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer stack.Stop()

	client := flo.NewClient(stack.GatewayGRPCAddr(), flo.WithNamespace("bench"))
	if err := client.Connect(); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer client.Close()
	if _, err := client.RegisterAction(ctx, "bench", flo.ActionOptions{Timeout: time.Minute, MaxAttempts: 3}); err != nil {
		return fmt.Errorf("register action: %w", err)
	}

	var lat latencies
	wctx, stopWorkers := context.WithCancel(ctx)
	var workers errgroup.Group
	defer func() {
		stopWorkers()
		if err := workers.Wait(); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "worker:", err)
		}
	}()
	for range o.workers {
		wc := flo.NewClient(stack.GatewayGRPCAddr(), flo.WithNamespace("bench"))
		if err := wc.Connect(); err != nil {
			return fmt.Errorf("connect worker: %w", err)
		}
		defer wc.Close()
		w, err := wc.NewActionWorker(flo.ActionWorkerOptions{Concurrency: o.concurrency})
		if err != nil {
			return fmt.Errorf("new worker: %w", err)
		}
		w.MustRegisterAction("bench", func(actx *flo.ActionContext) ([]byte, error) {
			var p payload
			if err := actx.Into(&p); err != nil {
				return nil, flo.NewNonRetryableErrorf("bad payload: %v", err)
			}
			lat.add(time.Since(time.Unix(0, p.InvokedAt)))
			return nil, nil
		})
		workers.Go(func() error { return w.Start(wctx) })
	}

	db, err := pgx.Connect(ctx, stack.DatabaseURL())
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer db.Close(ctx)

	mode := "unary Invoke"
	if o.batch > 0 {
		mode = fmt.Sprintf("InvokeMany of %d", o.batch)
	}
	fmt.Printf("full load: %d tasks, %d invokers (%s), %d workers x %d slots, fsync=%v\n",
		o.tasks, o.invokers, mode, o.workers, o.concurrency, o.fsync)
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	var next atomic.Int64
	var g errgroup.Group
	for range o.invokers {
		g.Go(func() error {
			// Each round takes the next chunk of task numbers.
			n := int64(max(o.batch, 1))
			for {
				hi := next.Add(n)
				lo := hi - n
				if lo >= int64(o.tasks) {
					return nil
				}
				if err := invoke(ctx, client, o.batch, int(min(hi, int64(o.tasks))-lo)); err != nil {
					return err
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	invoked := time.Since(start)
	if err := waitCompleted(ctx, db, o.tasks, start); err != nil {
		return err
	}
	elapsed := time.Since(start)
	rate := float64(o.tasks) / elapsed.Seconds()
	p50, p99, _ := lat.percentiles()
	fmt.Printf("  invoked in %v (%.0f invokes/s); all completed in %v\n", invoked.Round(time.Millisecond),
		float64(o.tasks)/invoked.Seconds(), elapsed.Round(time.Millisecond))
	fmt.Printf("  throughput %.0f tasks/s; invoke-to-start p50 %v p99 %v\n", rate, p50, p99)

	if o.halfLoadFor <= 0 {
		return nil
	}
	half, phase := rate/2, "half load"
	if o.rate > 0 {
		half, phase = o.rate, "paced load"
	}
	fmt.Printf("%s: %.0f tasks/s for %v\n", phase, half, o.halfLoadFor)
	lat.reset()
	n, err := paced(ctx, client, half, o.halfLoadFor, o.invokers, o.batch)
	if err != nil {
		return err
	}
	if err := waitCompleted(ctx, db, o.tasks+n, start); err != nil {
		return err
	}
	p50, p99, got := lat.percentiles()
	fmt.Printf("  %d tasks; invoke-to-start p50 %v p99 %v\n", got, p50, p99)
	return nil
}

// invoke creates n tasks stamped with the time now: one unary Invoke when
// batch is 0, else one InvokeMany call.
func invoke(ctx context.Context, client *flo.Client, batch, n int) error {
	if batch == 0 {
		body, err := json.Marshal(payload{InvokedAt: time.Now().UnixNano()})
		if err != nil {
			return fmt.Errorf("encode payload: %w", err)
		}
		if _, err := client.Invoke(ctx, "bench", body); err != nil {
			return fmt.Errorf("invoke: %w", err)
		}
		return nil
	}
	payloads := make([]any, n)
	for i := range payloads {
		payloads[i] = payload{InvokedAt: time.Now().UnixNano()}
	}
	if _, err := client.InvokeMany(ctx, "bench", payloads); err != nil {
		return fmt.Errorf("invoke many: %w", err)
	}
	return nil
}

// paced invokes at a fixed rate for d, spreading the ticks over workers so a
// slow invoke does not delay the next one. With batch > 0 each tick invokes
// a batch, and ticks come batch times less often.
func paced(ctx context.Context, client *flo.Client, rate float64, d time.Duration, invokers, batch int) (int, error) {
	per := max(batch, 1)
	interval := time.Duration(float64(time.Second) * float64(per) / rate)
	ticks := make(chan struct{}, invokers)
	var g errgroup.Group
	for range invokers {
		g.Go(func() error {
			for range ticks {
				if err := invoke(ctx, client, batch, per); err != nil {
					return err
				}
			}
			return nil
		})
	}
	n := 0
	deadline := time.Now().Add(d)
	next := time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Until(next))
		ticks <- struct{}{}
		n += per
		next = next.Add(interval)
	}
	close(ticks)
	return n, g.Wait()
}

// waitCompleted polls the task table until want tasks are completed: a
// measurement loop in a benchmark tool, not part of the platform.
func waitCompleted(ctx context.Context, db *pgx.Conn, want int, start time.Time) error {
	last := time.Now()
	for {
		var done int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM dispatcher.tasks WHERE state = 'completed'`).Scan(&done); err != nil {
			return fmt.Errorf("count completed tasks: %w", err)
		}
		if done >= want {
			return nil
		}
		if time.Since(last) > 2*time.Second {
			fmt.Printf("  ... %d/%d completed after %v\n", done, want, time.Since(start).Round(time.Second))
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
