package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/status"

	flo "github.com/razorbill/flo-go"
)

// workersChildFlag, as the first argument, makes flo-bench a load process of
// the workers mode: it runs idle SDK workers against the parent's gateway and
// reports on stdout. Only the mode starts it, so the usage text leaves it out.
const workersChildFlag = "-idle-workers-child"

const (
	// idleAction, idleStream and idleGroup are what the idle workers serve.
	idleAction = "idle"
	idleStream = "idle"
	idleGroup  = "idle"
	// idleWorkerPrefix starts the id of every worker the mode runs.
	idleWorkerPrefix = "idle-"
	// workersPerProcess is the most workers a load process holds when -procs
	// is 0: each worker is a connection, a file descriptor in the load
	// process and another in this one.
	workersPerProcess = 5000
	// connectedMessage is what the SDK logs when a worker's stream is open.
	connectedMessage = "flo: worker stream connected"
	// spreadBatch is the records of one AppendMany when the idle workers are
	// stream workers.
	spreadBatch = 100
)

// The kinds of line a load process writes, each followed by a worker id and,
// for warn and stopped, a text.
const (
	reportConnected = "connected" // the worker's first stream is open
	reportWarn      = "warn"      // the worker logged a warning
	reportRan       = "ran"       // the worker's handler ran a task or record
	reportStopped   = "stopped"   // the worker's Start returned an error
)

// benchWorkers measures what idle workers cost the platform: o.workers SDK
// workers in load processes of this binary, each on its own connection, that
// serve one action (or consume one stream's group) and otherwise wait. It
// prints how long until they are all connected and registered, this process's
// memory and goroutines after o.settle, this process's and Postgres's CPU over
// o.idle, how long o.spread tasks (or records) spread over them take, and,
// with o.overLimit, whether worker N+1 is refused.
func benchWorkers(ctx context.Context, p *platform, o options) error {
	if o.workers < 1 || o.procs < 0 || o.spread < 0 {
		return errors.New("-mode workers takes -workers 1 or more, -procs and -spread 0 or more")
	}
	// Every worker's connection ends in this process too.
	if err := checkFileLimit(o.workers + 1024); err != nil {
		return err
	}
	kind := "action"
	if o.streamWorkers {
		kind = "stream"
		if _, err := p.client.CreateStream(ctx, idleStream, flo.StreamOptions{}); err != nil {
			return fmt.Errorf("create stream: %w", err)
		}
		// The group exists before the workers start, so they do not all
		// race to create it.
		if _, err := p.client.CreateGroup(ctx, idleStream, idleGroup, flo.GroupOptions{Start: "-"}); err != nil {
			return fmt.Errorf("create group: %w", err)
		}
	} else if _, err := p.client.RegisterAction(ctx, idleAction, flo.ActionOptions{Timeout: time.Minute, MaxAttempts: 3}); err != nil {
		return fmt.Errorf("register action: %w", err)
	}
	db, err := p.openDB(ctx)
	if err != nil {
		return err
	}
	pgPID, err := postmaster(ctx, db)
	if err != nil {
		return err
	}

	before, err := readMemory()
	if err != nil {
		return err
	}
	counts := splitWorkers(o.workers, o.procs)
	fmt.Printf("workers: %d idle %s workers (default options) in load processes of %v, fsync=%v; stack alone: RSS %s, %d goroutines\n",
		o.workers, kind, counts, o.fsync, mib(before.rss), before.goroutines)
	f, err := startFleet(p, counts, o.streamWorkers)
	if err != nil {
		return err
	}
	defer f.stop()
	if err := f.waitUp(ctx, p.client, o.wait); err != nil {
		return err
	}

	fmt.Printf("  settling for %v\n", o.settle)
	if err := sleep(ctx, o.settle); err != nil {
		return err
	}
	after, err := readMemory()
	if err != nil {
		return err
	}
	per := func(a, b int64) float64 { return float64(a-b) / float64(o.workers) }
	fmt.Printf("  RSS %s (%.0f KiB per worker), Go heap in use %s, stacks %s, %d goroutines (%.1f per worker)\n",
		mib(after.rss), per(after.rss, before.rss)/1024, mib(int64(after.heap)), mib(int64(after.stacks)),
		after.goroutines, per(int64(after.goroutines), int64(before.goroutines)))

	if err := heapProfile(o.memProfile); err != nil {
		return err
	}
	stopProfile, err := profile(o.cpuProfile)
	if err != nil {
		return err
	}
	err = f.measureIdle(ctx, db, pgPID, o.idle)
	stopProfile()
	if err != nil {
		return err
	}
	if o.spread > 0 {
		if err := f.spreadWork(ctx, p, db, o.spread); err != nil {
			return err
		}
	}
	if o.overLimit {
		return overLimit(ctx, p, o)
	}
	return nil
}

// splitWorkers shares workers over procs load processes, or over as many as
// hold at most workersPerProcess each when procs is 0.
func splitWorkers(workers, procs int) []int {
	if procs <= 0 {
		procs = (workers + workersPerProcess - 1) / workersPerProcess
	}
	procs = max(min(procs, workers), 1)
	counts := make([]int, procs)
	for i := range counts {
		counts[i] = workers / procs
		if i < workers%procs {
			counts[i]++
		}
	}
	return counts
}

// checkFileLimit says whether this process may open need file descriptors.
// Go raises the soft limit to the hard one as a program starts, so there is
// nothing left to raise: past the hard limit it says how far short it is.
func checkFileLimit(need int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("read the file descriptor limit: %w", err)
	}
	if lim.Cur < uint64(need) {
		return fmt.Errorf("about %d file descriptors are needed and the limit (ulimit -n) is %d: raise it or use -procs", need, lim.Cur)
	}
	return nil
}

// memory is what this process holds, as the kernel and the Go runtime see it.
type memory struct {
	rss        int64
	heap       uint64 // heap spans in use
	stacks     uint64 // goroutine stacks
	goroutines int
}

func readMemory() (memory, error) {
	rss, err := processRSS("self")
	if err != nil {
		return memory{}, err
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memory{rss: rss, heap: ms.HeapInuse, stacks: ms.StackInuse, goroutines: runtime.NumGoroutine()}, nil
}

// processRSS is the resident memory of process pid ("self" for this one).
func processRSS(pid string) (int64, error) {
	data, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, fmt.Errorf("read process status: %w", err)
	}
	return vmRSS(data)
}

// vmRSS reads the VmRSS line of a /proc/<pid>/status file, in bytes.
func vmRSS(status []byte) (int64, error) {
	for line := range bytes.Lines(status) {
		rest, ok := bytes.CutPrefix(line, []byte("VmRSS:"))
		if !ok {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("process status: VmRSS line %q", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("process status: %w", err)
		}
		return kb << 10, nil
	}
	return 0, errors.New("process status: no VmRSS line")
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// fleet is the load processes and what they reported.
type fleet struct {
	want    int
	stream  bool
	started time.Time
	procs   []*loadProcess

	mu        sync.Mutex
	connected int
	// upIn is when the last worker connected, counted from started.
	upIn    time.Duration
	warns   int
	stopped int
	runs    int
	ran     map[string]int

	// warnKinds counts the warnings by their text with numbers left out,
	// so that a storm's hundreds say what they were in a few lines.
	warnKinds map[string]int
}

// maxWarnKinds bounds the kinds of worker warnings printed and counted.
const maxWarnKinds = 5

// warnKind is a warning's text with its numbers (attempts, delays with
// their units, addresses) replaced by #.
func warnKind(text string) string {
	var b strings.Builder
	number := false
	for _, r := range text {
		switch {
		case r >= '0' && r <= '9':
			if !number {
				b.WriteByte('#')
			}
			number = true
		case number && (r == '.' || unicode.IsLetter(r)):
			// A number's decimals and unit.
		default:
			b.WriteRune(r)
			number = false
		}
	}
	return b.String()
}

// loadProcess is one child process running idle workers.
type loadProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	// read is closed when its stdout has been read to the end.
	read chan struct{}
}

// startFleet starts a load process for each of counts, running that many
// workers against p's gateway with p's key.
func startFleet(p *platform, counts []int, stream bool) (*fleet, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program: %w", err)
	}
	f := &fleet{stream: stream, started: time.Now(), ran: map[string]int{}, warnKinds: map[string]int{}}
	first := 0
	for _, n := range counts {
		args := []string{workersChildFlag, "-addr", p.stack.GatewayGRPCAddr(), "-first", strconv.Itoa(first), "-count", strconv.Itoa(n)}
		if stream {
			args = append(args, "-stream")
		}
		first += n
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), "FLO_TOKEN="+p.token)
		cmd.Stderr = os.Stderr
		// A parent that dies without closing stdin takes its children along.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		lp := &loadProcess{cmd: cmd, read: make(chan struct{})}
		stdout, err := cmd.StdoutPipe()
		if err == nil {
			lp.stdin, err = cmd.StdinPipe()
		}
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			f.stop()
			return nil, fmt.Errorf("start a load process: %w", err)
		}
		f.procs = append(f.procs, lp)
		f.want += n
		go func() {
			defer close(lp.read)
			f.read(stdout)
		}()
	}
	return f, nil
}

// read takes a load process's reports until its stdout ends.
func (f *fleet) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		kind, id, text := parseReport(sc.Text())
		f.mu.Lock()
		switch kind {
		case reportConnected:
			f.connected++
			if f.connected == f.want {
				f.upIn = time.Since(f.started)
			}
		case reportWarn:
			f.warns++
			// The first of each of a few kinds say what went wrong; the
			// counts say how often.
			kind := warnKind(text)
			if f.warnKinds[kind] == 0 && len(f.warnKinds) < maxWarnKinds {
				fmt.Fprintf(os.Stderr, "  worker %s: %s\n", id, text)
			}
			if f.warnKinds[kind] > 0 || len(f.warnKinds) < maxWarnKinds {
				f.warnKinds[kind]++
			}
		case reportRan:
			f.runs++
			f.ran[id]++
		case reportStopped:
			f.stopped++
			if f.stopped <= 5 {
				fmt.Fprintf(os.Stderr, "  worker %s stopped: %s\n", id, text)
			}
		}
		f.mu.Unlock()
	}
}

// parseReport splits a load process's line into its kind, worker id and text.
func parseReport(line string) (kind, id, text string) {
	kind, rest, _ := strings.Cut(line, " ")
	id, text, _ = strings.Cut(rest, " ")
	return kind, id, text
}

// stop closes the load processes' stdin, which stops their workers (each
// deregisters), and waits for them to exit; after two minutes it kills them.
func (f *fleet) stop() {
	for _, lp := range f.procs {
		lp.stdin.Close()
	}
	kill := time.AfterFunc(2*time.Minute, func() {
		for _, lp := range f.procs {
			_ = lp.cmd.Process.Kill()
		}
	})
	defer kill.Stop()
	for _, lp := range f.procs {
		<-lp.read
		if err := lp.cmd.Wait(); err != nil {
			fmt.Fprintln(os.Stderr, "flo-bench: load process:", err)
		}
	}
}

// waitUp waits until every worker has connected and is listed in the
// registry, or until limit has passed, and prints how long each took. The
// registry is listed through client, page by page, as `flo worker list` does.
func (f *fleet) waitUp(ctx context.Context, client *flo.Client, limit time.Duration) error {
	var (
		registeredIn time.Duration
		registered   int
		listErr      error
		last         = time.Now()
	)
	deadline := f.started.Add(limit)
	for {
		if registeredIn == 0 {
			n, err := countIdleWorkers(ctx, client)
			if listErr = err; err == nil {
				registered = n
			}
			if registered >= f.want {
				registeredIn = time.Since(f.started)
			}
		}
		f.mu.Lock()
		connected, upIn, stopped := f.connected, f.upIn, f.stopped
		f.mu.Unlock()
		if registeredIn > 0 && upIn > 0 || time.Now().After(deadline) || stopped > 0 {
			break
		}
		if time.Since(last) > 2*time.Second {
			fmt.Printf("  ... %d connected, %d registered after %v", connected, registered, time.Since(f.started).Round(time.Second))
			if listErr != nil {
				fmt.Printf(" (listing: %v)", listErr)
			}
			fmt.Println()
			last = time.Now()
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fmt.Printf("  all connected in %s, all registered in %s; %d warnings from workers, %d stopped\n",
		took(f.upIn, f.connected, f.want), took(registeredIn, registered, f.want), f.warns, f.stopped)
	for kind, n := range f.warnKinds {
		fmt.Printf("    %d× %s\n", n, kind)
	}
	if f.stopped > 0 {
		return fmt.Errorf("%d workers stopped", f.stopped)
	}
	return nil
}

// took is d, or how many of want got there when d is 0.
func took(d time.Duration, got, want int) string {
	if d == 0 {
		return fmt.Sprintf("never (%d of %d)", got, want)
	}
	return d.Round(10 * time.Millisecond).String()
}

// countIdleWorkers counts the registry's idle workers.
func countIdleWorkers(ctx context.Context, client *flo.Client) (int, error) {
	list, err := client.ListWorkers(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, w := range list {
		if strings.HasPrefix(w.WorkerID, idleWorkerPrefix) {
			n++
		}
	}
	return n, nil
}

// measureIdle prints the CPU of this process, of Postgres and of the load
// processes, and Postgres's commits, per second over d while nothing but the
// idle workers runs.
func (f *fleet) measureIdle(ctx context.Context, db *pgx.Conn, pgPID int, d time.Duration) error {
	type reading struct {
		self, pg, load time.Duration
		commits        int64
	}
	read := func() (r reading, err error) {
		if r.self, err = processCPU(); err != nil {
			return r, err
		}
		if pgPID != 0 {
			if r.pg, err = postgresCPU(pgPID); err != nil {
				return r, err
			}
		}
		for _, lp := range f.procs {
			st, err := procStat(lp.cmd.Process.Pid)
			if err != nil {
				return r, err
			}
			r.load += time.Duration(st.utime+st.stime) * time.Second / clockTicks
		}
		r.commits, err = commits(ctx, db)
		return r, err
	}
	from, err := read()
	if err != nil {
		return err
	}
	if err := sleep(ctx, d); err != nil {
		return err
	}
	to, err := read()
	if err != nil {
		return err
	}
	pct := func(cpu time.Duration) string { return fmt.Sprintf("%.1f%%", 100*cpu.Seconds()/d.Seconds()) }
	pg := "not on this machine"
	if pgPID != 0 {
		pg = pct(to.pg - from.pg)
	}
	var loadRSS int64
	for _, lp := range f.procs {
		rss, err := processRSS(strconv.Itoa(lp.cmd.Process.Pid))
		if err != nil {
			return err
		}
		loadRSS += rss
	}
	fmt.Printf("  idle over %v, CPU of a core: this process %s, Postgres %s (%.1f commits/s); load processes %s, RSS %s\n",
		d, pct(to.self-from.self), pg, float64(to.commits-from.commits)/d.Seconds(), pct(to.load-from.load), mib(loadRSS))
	return nil
}

// spreadWork invokes n tasks of the idle action (or appends n records to the
// idle stream) and prints how long until every one was handled and, for
// tasks, completed, and how many distinct workers handled them.
func (f *fleet) spreadWork(ctx context.Context, p *platform, db *pgx.Conn, n int) error {
	f.mu.Lock()
	f.runs, f.ran = 0, map[string]int{}
	f.mu.Unlock()
	what, batch := "tasks", flo.MaxInvokeBatch
	send := func(payloads []any) error {
		_, err := p.client.InvokeMany(ctx, idleAction, payloads)
		return err
	}
	if f.stream {
		what, batch = "records", spreadBatch
		send = func(payloads []any) error {
			_, err := p.client.AppendMany(ctx, idleStream, payloads)
			return err
		}
	}
	payloads := make([]any, n)
	for i := range payloads {
		payloads[i] = map[string]int{"i": i}
	}
	start := time.Now()
	err := chunks(1, n, batch, func(lo, hi int) error { return send(payloads[lo:hi]) })
	if err != nil {
		return fmt.Errorf("spread %s: %w", what, err)
	}
	sent := time.Since(start)
	err = waitFor(ctx, start, what+" handled", func() (int, int, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.runs, n, nil
	})
	if err != nil {
		return err
	}
	handled := time.Since(start)
	done := ""
	if !f.stream {
		if err := waitCompleted(ctx, db, n, start); err != nil {
			return err
		}
		done = fmt.Sprintf(", all completed in %v", time.Since(start).Round(time.Millisecond))
	}
	f.mu.Lock()
	most := 0
	for _, k := range f.ran {
		most = max(most, k)
	}
	workers := len(f.ran)
	f.mu.Unlock()
	fmt.Printf("  %d %s: sent in %v, all handled in %v%s; by %d distinct workers, at most %d by one\n",
		n, what, sent.Round(time.Millisecond), handled.Round(time.Millisecond), done, workers, most)
	return nil
}

// overLimit starts worker N+1 in this process and prints whether the
// registry refuses it, as it must when -workers is the namespace's limit
// (FLO_MAX_WORKERS_PER_NAMESPACE).
func overLimit(ctx context.Context, p *platform, o options) error {
	c, err := p.connect()
	if err != nil {
		return err
	}
	id := idleWorkerPrefix + strconv.Itoa(o.workers)
	w, err := newIdleWorker(c, id, o.streamWorkers, p.log, func() {})
	if err != nil {
		return err
	}
	const runFor = 30 * time.Second
	ctx, cancel := context.WithTimeout(ctx, runFor)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		fmt.Printf("  worker %d: refused, %s: %v\n", o.workers+1, status.Code(err), err)
		return nil
	}
	fmt.Printf("  worker %d: not refused, it ran for %v\n", o.workers+1, runFor)
	return nil
}

// newIdleWorker returns an SDK worker with default options but its id and
// logger that serves the idle action, or consumes the idle stream's group,
// calling ran for each task or record.
func newIdleWorker(c *flo.Client, id string, stream bool, log *slog.Logger, ran func()) (starter, error) {
	if stream {
		return c.NewStreamWorker(flo.StreamWorkerOptions{Stream: idleStream, Group: idleGroup, WorkerID: id, Logger: log},
			func(*flo.StreamContext) error {
				ran()
				return nil
			})
	}
	w, err := c.NewActionWorker(flo.ActionWorkerOptions{WorkerID: id, Logger: log})
	if err != nil {
		return nil, err
	}
	err = w.RegisterAction(idleAction, func(*flo.ActionContext) ([]byte, error) {
		ran()
		return nil, nil
	})
	return w, err
}

// runWorkersChild is a load process: it runs -count idle workers, numbered
// from -first, against the gateway at -addr with the key in FLO_TOKEN, each
// with its own client (its own connection), all started at once, and writes
// what they report to stdout until its stdin ends.
func runWorkersChild(args []string) error {
	fs := flag.NewFlagSet("flo-bench "+workersChildFlag, flag.ContinueOnError)
	addr := fs.String("addr", "", "the gateway")
	first := fs.Int("first", 0, "the number of the first worker")
	count := fs.Int("count", 0, "how many workers to run")
	stream := fs.Bool("stream", false, "stream workers instead of action workers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := checkFileLimit(*count + 256); err != nil {
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		// The parent closes our stdin to stop us; its death closes it too.
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	out := &reporter{w: os.Stdout}
	var wg sync.WaitGroup
	for i := range *count {
		id := idleWorkerPrefix + strconv.Itoa(*first+i)
		wg.Go(func() {
			if err := runIdleWorker(ctx, *addr, id, *stream, out); err != nil {
				out.send(reportStopped, id, err.Error())
			}
		})
	}
	wg.Wait()
	return nil
}

func runIdleWorker(ctx context.Context, addr, id string, stream bool, out *reporter) error {
	c := flo.NewClient(addr, flo.WithNamespace(namespace))
	if err := c.Connect(); err != nil {
		return err
	}
	defer c.Close()
	log := slog.New(&workerLog{id: id, out: out})
	w, err := newIdleWorker(c, id, stream, log, func() { out.send(reportRan, id, "") })
	if err != nil {
		return err
	}
	return w.Start(ctx)
}

// reporter writes a load process's reports, a line each.
type reporter struct {
	mu sync.Mutex
	w  io.Writer
}

func (r *reporter) send(kind, id, text string) {
	line := kind + " " + id
	if text != "" {
		line += " " + strings.ReplaceAll(text, "\n", " ")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintln(r.w, line)
}

// workerLog is an idle worker's logger: it reports the worker's first
// connection and its warnings instead of writing them.
type workerLog struct {
	id        string
	out       *reporter
	connected atomic.Bool
}

func (l *workerLog) Enabled(_ context.Context, level slog.Level) bool { return level >= slog.LevelInfo }

func (l *workerLog) Handle(_ context.Context, r slog.Record) error {
	switch {
	case r.Message == connectedMessage:
		if !l.connected.Swap(true) {
			l.out.send(reportConnected, l.id, "")
		}
	case r.Level >= slog.LevelWarn:
		text := r.Message
		r.Attrs(func(a slog.Attr) bool {
			text += " " + a.String()
			return true
		})
		l.out.send(reportWarn, l.id, text)
	}
	return nil
}

func (l *workerLog) WithAttrs([]slog.Attr) slog.Handler { return l }

func (l *workerLog) WithGroup(string) slog.Handler { return l }

// heapProfile writes a heap profile to path, after a collection so that it
// shows what is live now; an empty path writes nothing.
func heapProfile(path string) error {
	if path == "" {
		return nil
	}
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	return nil
}
