package devstack_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/libs/harness"
)

// services are the five service binaries, each under cmd/<name>; the
// gateway, which is given the others' addresses, comes last.
var services = []string{"dispatcher", "registry", "streams", "workflow", "gateway"}

// shutdownDelay is FLO_SHUTDOWN_DELAY for the processes: long enough that a
// poll of /readyz sees readiness off before the process stops serving.
const shutdownDelay = 500 * time.Millisecond

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// serviceBinaries builds the five real binaries once per test run and returns
// the directory holding them.
func serviceBinaries(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "flo-service-bins-"); binErr != nil {
			return
		}
		// Without symbols the link, most of the build, is quicker.
		args := []string{"build", "-ldflags=-s -w", "-o", binDir + string(filepath.Separator)}
		for _, s := range services {
			args = append(args, "github.com/razorbill/flo/services/"+s+"/cmd/"+s)
		}
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build services: %v\n%s", err, out)
		}
	})
	require.NoError(t, binErr)
	return binDir
}

// proc is one service running as its own OS process, stopped and restarted
// the way an orchestrator does it.
type proc struct {
	// name tells the process apart in logs; service is its binary and the
	// FLO_<SERVICE>_* prefix of its listen addresses.
	name     string
	service  string
	bin      string
	env      []string
	addrFile string
	logs     *os.File
	// grpcAddr and httpAddr are where the process listens: empty until its
	// first start, which binds port 0 and reports the ports it got through
	// FLO_ADDR_FILE; later starts listen there again, as a restarted pod
	// keeps its address.
	grpcAddr, httpAddr string

	cmd    *exec.Cmd
	exited chan struct{}
}

// newProc prepares the service name to run as a process, with env added to
// the test's environment. Its output goes to a file shown when the test
// fails; at cleanup it gets SIGTERM.
func newProc(t *testing.T, name string, env []string) *proc {
	t.Helper()
	return newReplicaProc(t, name, name, env)
}

// newReplicaProc is newProc for one of several processes of service, told
// apart as name.
func newReplicaProc(t *testing.T, service, name string, env []string) *proc {
	t.Helper()
	dir := t.TempDir()
	logs, err := os.Create(filepath.Join(dir, name+".log"))
	require.NoError(t, err)
	p := &proc{name: name, service: service, bin: filepath.Join(serviceBinaries(t), service), env: env,
		addrFile: filepath.Join(dir, name+".addr"), logs: logs}
	t.Cleanup(func() {
		if p.exited != nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not stop", name)
				p.kill()
			}
		}
		logs.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logs.Name())
			t.Logf("%s output:\n%s", name, tail(out, 40))
		}
	})
	return p
}

// start starts the process and, on its first start, waits until it has
// reported the addresses it listens on.
func (p *proc) start(t *testing.T) {
	t.Helper()
	first := p.grpcAddr == ""
	grpcAddr, httpAddr := p.grpcAddr, p.httpAddr
	if first {
		grpcAddr, httpAddr = "127.0.0.1:0", "127.0.0.1:0"
	}
	upper := strings.ToUpper(p.service)
	p.cmd = exec.Command(p.bin)
	// Every process of a test shares the harness's internal token.
	p.cmd.Env = append(os.Environ(), "FLO_INTERNAL_TOKEN="+harness.InternalAuth().InternalToken)
	p.cmd.Env = append(p.cmd.Env, p.env...)
	p.cmd.Env = append(p.cmd.Env, "FLO_"+upper+"_GRPC_ADDR="+grpcAddr, "FLO_"+upper+"_HTTP_ADDR="+httpAddr, "FLO_ADDR_FILE="+p.addrFile)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	require.NoError(t, p.cmd.Start(), "start %s", p.name)
	p.exited = make(chan struct{})
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	if !first {
		return
	}
	require.Eventually(t, func() bool {
		select {
		case <-p.exited:
			t.Fatalf("%s exited while starting: %s", p.name, p.cmd.ProcessState)
		default:
		}
		addrs, err := cmdline.ReadAddrs(p.addrFile)
		if errors.Is(err, fs.ErrNotExist) {
			return false
		}
		require.NoError(t, err)
		p.grpcAddr, p.httpAddr = addrs.GRPC, addrs.HTTP
		return true
	}, time.Minute, 10*time.Millisecond, "%s never reported its addresses", p.name)
}

// readyz returns the status of GET /readyz, or 0 when nothing answered.
func (p *proc) readyz() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+"/readyz", nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (p *proc) waitReady(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case <-p.exited:
			t.Fatalf("%s exited while starting: %s", p.name, p.cmd.ProcessState)
		default:
		}
		return p.readyz() == http.StatusOK
	}, time.Minute, 20*time.Millisecond, "%s never became ready", p.name)
}

// sigterm sends SIGTERM and requires that /readyz turns 503 while the process
// still serves, and that the process then exits with status 0.
func (p *proc) sigterm(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	for notReady := false; !notReady; {
		select {
		case <-p.exited:
			t.Fatalf("%s exited (%s) before its readiness was seen off", p.name, p.cmd.ProcessState)
		default:
		}
		notReady = p.readyz() == http.StatusServiceUnavailable
		if !notReady {
			time.Sleep(5 * time.Millisecond)
		}
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not exit after SIGTERM", p.name)
	}
	require.Equal(t, 0, p.cmd.ProcessState.ExitCode(), "%s exit status after SIGTERM", p.name)
}

// kill ends the process with SIGKILL, as a crash would.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// sigkill kills the process while it works, as an OOM kill or a lost node
// would, and requires that the signal is what ended it, not an earlier exit.
func (p *proc) sigkill(t *testing.T) {
	t.Helper()
	p.kill()
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%s ended before the kill: %s", p.name, p.cmd.ProcessState)
}

// crash kills the process (sigkill), starts it again on the same addresses
// and waits until it is ready.
func (p *proc) crash(t *testing.T) {
	t.Helper()
	p.sigkill(t)
	p.start(t)
	p.waitReady(t)
}

// restart sends SIGTERM (checked as in sigterm), starts the service again on
// the same addresses and waits until it is ready.
func (p *proc) restart(t *testing.T) {
	t.Helper()
	p.sigterm(t)
	p.start(t)
	p.waitReady(t)
}

// processPlatform is every service as a process against a harness database
// and broker.
type processPlatform struct {
	procs       map[string]*proc
	gatewayGRPC string
	brokers     []string
	env         *env
	// dbURL and common are what every service process is given, for
	// replicas a test adds.
	dbURL  string
	common []string
}

func startProcessPlatform(t *testing.T) *processPlatform {
	t.Helper()
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	level := "warn"
	if testing.Verbose() {
		level = "info"
	}
	common := []string{
		"FLO_KAFKA_BROKERS=" + strings.Join(broker.Addrs(), ","),
		"FLO_KAFKA_PARTITIONS=4",
		"FLO_LOG_LEVEL=" + level,
		"FLO_SHUTDOWN_DELAY=" + shutdownDelay.String(),
		"FLO_BOOTSTRAP_NAMESPACES=default",
		"FLO_MAX_PAYLOAD_BYTES=65536",
		"FLO_ADMIN_TOKEN=" + testAdminToken,
		// A small bound of queued tasks per partition, so the failure
		// tests' backlogs (their delayed tasks above all) go cold and are
		// read back from the view across kills, pauses and restarts.
		"FLO_DISPATCH_QUEUED_TASKS=20",
	}
	pl := &processPlatform{procs: map[string]*proc{}, brokers: broker.Addrs(), env: &env{db: openPool(t, dbURL)}, dbURL: dbURL, common: common}
	// services lists the gateway last: it is started once the others have
	// reported their addresses, which it is given.
	for _, s := range services {
		vars := append([]string{"FLO_DATABASE_URL=" + withApplicationName(t, dbURL, s)}, common...)
		if s == "gateway" {
			// Its metrics port too is one the system picks.
			vars = append(vars, "FLO_GATEWAY_METRICS_ADDR=127.0.0.1:0")
			for _, dep := range []string{"dispatcher", "registry", "streams", "workflow"} {
				vars = append(vars, "FLO_"+strings.ToUpper(dep)+"_ADDR="+pl.procs[dep].grpcAddr)
			}
		}
		if s == "workflow" {
			// Records a killed replica held come back soon.
			vars = append(vars, "FLO_STREAMS_ADDR="+pl.procs["streams"].grpcAddr, "FLO_WORKFLOW_TRIGGER_TIMEOUT=2s")
		}
		pl.procs[s] = newProc(t, s, vars)
		pl.procs[s].start(t)
	}
	for _, s := range services {
		pl.procs[s].waitReady(t)
	}
	pl.gatewayGRPC = pl.procs["gateway"].grpcAddr
	// Before the processes stop (cleanups run last first): a failed test
	// shows what each dispatcher still holds, its queued tasks held and
	// cold by partition, for a stall a handful of tasks big.
	t.Cleanup(func() {
		if t.Failed() {
			pl.logQueuedTasks(t)
		}
	})
	return pl
}

// logQueuedTasks logs the flo_dispatcher_queued_tasks gauges of every
// dispatcher process still running.
func (pl *processPlatform) logQueuedTasks(t *testing.T) {
	for name, p := range pl.procs {
		if p.service != "dispatcher" || p.httpAddr == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+"/metrics", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Logf("%s: metrics not read: %v", name, err)
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if err != nil {
			t.Logf("%s: metrics not read: %v", name, err)
			continue
		}
		for line := range strings.Lines(string(body)) {
			if strings.HasPrefix(line, "flo_dispatcher_queued_tasks") {
				t.Logf("%s: %s", name, strings.TrimSpace(line))
			}
		}
	}
}

// withApplicationName names a service's database sessions, so a test can
// tell them apart in pg_stat_activity.
func withApplicationName(t *testing.T, dbURL, name string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// tail returns the last n lines of out.
func tail(out []byte, n int) []byte {
	lines := bytes.SplitAfter(out, []byte("\n"))
	return bytes.Join(lines[max(0, len(lines)-n):], nil)
}

// client connects an SDK client to the gateway process.
func (pl *processPlatform) client(t *testing.T) *flo.Client { return connect(t, pl.gatewayGRPC) }

// connect connects an SDK client to the gateway at addr until the test ends.
func connect(t *testing.T, addr string) *flo.Client {
	t.Helper()
	c := flo.NewClient(addr)
	require.NoError(t, c.Connect())
	t.Cleanup(func() { c.Close() })
	return c
}

// actionWorker runs an ActionWorker with the handlers register adds, on its
// own connection to the gateway at addr, until the test ends.
func actionWorker(t *testing.T, addr string, opts flo.ActionWorkerOptions, register func(w *flo.ActionWorker)) {
	t.Helper()
	w, err := connect(t, addr).NewActionWorker(opts)
	require.NoError(t, err)
	register(w)
	runUntilCleanup(t, "action worker", w.Start)
}

// runUntilCleanup runs a worker's Start until the test ends.
func runUntilCleanup(t *testing.T, name string, start func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop", name)
		}
	})
}

// handlerRuns counts, per task or record id, the handler runs that returned
// success.
type handlerRuns struct {
	mu   sync.Mutex
	runs map[string]int
}

func (h *handlerRuns) add(id string) {
	h.mu.Lock()
	h.runs[id]++
	h.mu.Unlock()
}

// requireEachRan checks every id ran at least once, the promise of
// at-least-once delivery, and nothing else ran, and reports how many ran
// again.
func (h *handlerRuns) requireEachRan(t *testing.T, ids []string) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	again := 0
	for _, id := range ids {
		require.Positive(t, h.runs[id], "%s never reached a handler", id)
		again += h.runs[id] - 1
	}
	require.Len(t, h.runs, len(ids), "handlers ran for ids that were never started")
	t.Logf("%d ids, %d handler runs repeated (at-least-once delivery)", len(ids), again)
}

// pacedLoad keeps starting work through faults: n items (tasks, runs) from 8
// goroutines that pause between items, each started with an idempotency key
// and retried until the gateway accepts it, as a careful client does across
// an outage.
type pacedLoad struct {
	ids      []string
	accepted atomic.Int64
	done     chan struct{}
}

// startLoad starts item i with start, which returns its id.
func startLoad(t *testing.T, n int, pause time.Duration, start func(ctx context.Context, i int) (string, error)) *pacedLoad {
	t.Helper()
	l := &pacedLoad{ids: make([]string, n), done: make(chan struct{})}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				deadline := time.Now().Add(time.Minute)
				for {
					id, err := start(context.Background(), i)
					if err == nil {
						l.ids[i] = id
						l.accepted.Add(1)
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("item %d never accepted: %v", i, err)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
				time.Sleep(pause)
			}
		})
	}
	go func() {
		wg.Wait()
		close(l.done)
	}()
	return l
}

// invokeKeyed invokes task i of action with payload {"i": i} and the
// idempotency key prefix-i.
func invokeKeyed(c *flo.Client, action, prefix string) func(ctx context.Context, i int) (string, error) {
	return func(ctx context.Context, i int) (string, error) {
		return c.Invoke(ctx, action, map[string]int{"i": i}, flo.WithIdempotencyKey(fmt.Sprintf("%s-%d", prefix, i)))
	}
}

// reach waits until k invocations were accepted or the load ended.
func (l *pacedLoad) reach(t *testing.T, k int) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case <-l.done:
			return true
		default:
			return l.accepted.Load() >= int64(k)
		}
	}, time.Minute, 5*time.Millisecond)
}

func (l *pacedLoad) wait(t *testing.T) []string {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the load never finished")
	}
	return l.ids
}

const oneStepWorkflowYAML = `kind: Workflow
name: one-step
version: "1"
idempotency: optional
start:
  run: "@actions/step"
  transitions:
    success: flo.Completed
    failure: flo.Failed
`

// TestSIGTERMUnderLoadLosesNothing runs the real binaries, sends each of them
// SIGTERM while it works and restarts it: every time readiness goes off
// before the process exits, the exit status is 0, and nothing is lost.
func TestSIGTERMUnderLoadLosesNothing(t *testing.T) {
	pl := startProcessPlatform(t)
	ctx := context.Background()
	client := pl.client(t)
	for _, a := range []string{"work", "step"} {
		_, err := client.RegisterAction(ctx, a, flo.ActionOptions{Timeout: 3 * time.Second, MaxAttempts: 20})
		require.NoError(t, err)
	}
	ran := &handlerRuns{runs: map[string]int{}}
	opts := flo.ActionWorkerOptions{WorkerID: "sigterm-worker", Concurrency: 32, HeartbeatInterval: 200 * time.Millisecond}
	actionWorker(t, pl.gatewayGRPC, opts, func(w *flo.ActionWorker) {
		w.MustRegisterAction("work", func(actx *flo.ActionContext) ([]byte, error) {
			ran.add(actx.TaskID())
			return actx.Bytes("ok")
		})
		w.MustRegisterAction("step", func(actx *flo.ActionContext) ([]byte, error) { return actx.Bytes("ok") })
	})

	t.Run("dispatcher, gateway and registry under task load", func(t *testing.T) {
		const n = 2000
		load := startLoad(t, n, 20*time.Millisecond, invokeKeyed(client, "work", "task"))
		load.reach(t, n/5)
		pl.procs["dispatcher"].restart(t)
		load.reach(t, n/2)
		pl.procs["gateway"].restart(t)
		load.reach(t, 3*n/4)
		pl.procs["registry"].restart(t)
		ids := load.wait(t)

		requireEachCompletedOnce(t, pl.env, pl.brokers, ids)
		ran.requireEachRan(t, ids)
		// The registry counted each completion once, across its own restart.
		require.Eventually(t, func() bool {
			w, err := client.GetWorker(ctx, "sigterm-worker")
			return err == nil && w.TasksCompleted == n
		}, 30*time.Second, 50*time.Millisecond, "the registry's count of completed tasks never reached %d", n)
	})

	t.Run("workflow under run load", func(t *testing.T) {
		_, _, err := client.CreateWorkflow(ctx, oneStepWorkflowYAML)
		require.NoError(t, err)
		const n = 300
		load := startLoad(t, n, 20*time.Millisecond, func(ctx context.Context, i int) (string, error) {
			run, err := client.StartWorkflow(ctx, "one-step", map[string]int{"i": i}, flo.StartWorkflowOptions{IdempotencyKey: fmt.Sprintf("run-%d", i)})
			if err != nil {
				return "", err
			}
			return run.RunID, nil
		})
		load.reach(t, n/3)
		pl.procs["workflow"].restart(t)
		ids := load.wait(t)
		for _, id := range ids {
			run, err := client.AwaitRun(ctx, id)
			require.NoError(t, err)
			require.Equal(t, flo.RunCompleted, run.Status, "run %s: %s", id, run.Error)
		}
	})

	t.Run("streams under consumption", func(t *testing.T) {
		_, err := client.CreateStream(ctx, "feed", flo.StreamOptions{Partitions: 4})
		require.NoError(t, err)
		got := newHandled()
		sw, err := pl.client(t).NewStreamWorker(flo.StreamWorkerOptions{
			Stream: "feed", Group: "g", Concurrency: 16, BatchSize: 100, MessageTimeout: 3 * time.Second,
		}, func(sctx *flo.StreamContext) error {
			got.add(sctx.StreamID())
			return nil
		})
		require.NoError(t, err)
		runUntilCleanup(t, "stream worker", sw.Start)
		const n = 3000
		ids := appendN(t, client, "feed", n, 300)
		require.Eventually(t, func() bool { return got.total.Load() >= n/3 }, time.Minute, 5*time.Millisecond)
		pl.procs["streams"].restart(t)
		got.requireEachOnce(t, ids, time.Minute)
		requireSettled(t, client, "feed", "g")
	})
}
