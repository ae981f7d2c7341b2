package flo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// registryPeer plays the worker registry as the gateway exposes it: it keeps the registrations
// it got, answers heartbeats with the worker's status (NotFound for a worker it does not know)
// and logs every call, and the worker streams' openings, in order.
type registryPeer struct {
	flov1.UnimplementedWorkerRegistryServiceServer

	mu          sync.Mutex
	log         []string
	workers     map[string]*flov1.RegisterWorkerRequest
	statuses    map[string]flov1.WorkerStatus
	heartbeats  []*flov1.HeartbeatRequest
	registerErr error
	// failures registrations still fail with registerErr (and trailer); zero with registerErr
	// set: all of them.
	failures int
	trailer  metadata.MD
}

func newRegistryPeer() *registryPeer {
	return &registryPeer{workers: map[string]*flov1.RegisterWorkerRequest{}, statuses: map[string]flov1.WorkerStatus{}}
}

func (r *registryPeer) record(entry string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, entry)
}

// calls returns the log so far.
func (r *registryPeer) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

func (r *registryPeer) count(entry string) int {
	n := 0
	for _, c := range r.calls() {
		if c == entry {
			n++
		}
	}
	return n
}

func (r *registryPeer) registration(id string) *flov1.RegisterWorkerRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.workers[id]
}

// loads returns the current_load of every heartbeat so far.
func (r *registryPeer) loads() []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]int32, len(r.heartbeats))
	for i, hb := range r.heartbeats {
		out[i] = hb.GetCurrentLoad()
	}
	return out
}

// setRegisterErr makes every RegisterWorker fail with err (nil: succeed again).
func (r *registryPeer) setRegisterErr(err error) { r.failRegistrations(0, err, nil) }

// failRegistrations makes the next n registrations fail with err, answered with trailer.
func (r *registryPeer) failRegistrations(n int, err error, trailer metadata.MD) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.registerErr, r.failures, r.trailer = err, n, trailer
}

// drain marks the worker draining, as DrainWorker through the CLI would.
func (r *registryPeer) drain(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses[id] = flov1.WorkerStatus_WORKER_STATUS_DRAINING
}

// forget removes the worker's record, as an operator's deregister would.
func (r *registryPeer) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.workers, id)
	delete(r.statuses, id)
}

func (r *registryPeer) RegisterWorker(ctx context.Context, req *flov1.RegisterWorkerRequest) (*flov1.Worker, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "register "+req.GetWorkerId())
	if err := r.registerErr; err != nil {
		if r.trailer != nil {
			_ = grpc.SetTrailer(ctx, r.trailer)
		}
		if r.failures > 0 {
			if r.failures--; r.failures == 0 {
				r.registerErr = nil
			}
		}
		return nil, err
	}
	r.workers[req.GetWorkerId()] = req
	r.statuses[req.GetWorkerId()] = flov1.WorkerStatus_WORKER_STATUS_ACTIVE
	return &flov1.Worker{Namespace: req.GetNamespace(), WorkerId: req.GetWorkerId(), Status: flov1.WorkerStatus_WORKER_STATUS_ACTIVE}, nil
}

func (r *registryPeer) Heartbeat(_ context.Context, req *flov1.HeartbeatRequest) (*flov1.HeartbeatResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "heartbeat "+req.GetWorkerId())
	r.heartbeats = append(r.heartbeats, req)
	st, ok := r.statuses[req.GetWorkerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "worker %s not found", req.GetWorkerId())
	}
	return &flov1.HeartbeatResponse{Status: st}, nil
}

func (r *registryPeer) DeregisterWorker(_ context.Context, req *flov1.GetWorkerRequest) (*flov1.DeregisterWorkerResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "deregister "+req.GetWorkerId())
	delete(r.workers, req.GetWorkerId())
	delete(r.statuses, req.GetWorkerId())
	return &flov1.DeregisterWorkerResponse{}, nil
}

var recorded = &flov1.Worker{
	Namespace: "myapp", WorkerId: "w-9", WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION,
	Status: flov1.WorkerStatus_WORKER_STATUS_DRAINING, MaxConcurrency: 5, CurrentLoad: 2,
	MachineId: "m-9", Metadata: `{"version":"1.2.3"}`, TasksCompleted: 7, TasksFailed: 1,
	Processes: []*flov1.WorkerProcess{{
		Name: "process-order", Kind: flov1.ProcessKind_PROCESS_KIND_ACTION, RunCount: 7, FailCount: 1,
		LastRunAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
	}},
	RegisteredAt:  timestamppb.New(time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)),
	LastHeartbeat: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)),
}

func (r *registryPeer) GetWorker(_ context.Context, req *flov1.GetWorkerRequest) (*flov1.Worker, error) {
	if req.GetWorkerId() != recorded.GetWorkerId() {
		return nil, status.Errorf(codes.NotFound, "worker %s not found", req.GetWorkerId())
	}
	return recorded, nil
}

func (r *registryPeer) ListWorkers(_ context.Context, req *flov1.ListWorkersRequest) (*flov1.ListWorkersResponse, error) {
	r.record("list " + req.GetNamespace())
	return &flov1.ListWorkersResponse{Workers: []*flov1.Worker{recorded}}, nil
}

func (r *registryPeer) DrainWorker(_ context.Context, req *flov1.GetWorkerRequest) (*flov1.Worker, error) {
	r.record("drain " + req.GetWorkerId())
	return recorded, nil
}

// startWorker runs w.Start in the background and returns what it returns.
func startWorker(t *testing.T, w *flo.ActionWorker) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	return done
}

func requireReturns(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(waitFor):
		t.Fatal("Start did not return")
		return nil
	}
}

// untilClosed returns everything the worker sends until it closes its side of the stream.
func (ps *peerStream) untilClosed() []*flov1.WorkerMessage {
	ps.t.Helper()
	var got []*flov1.WorkerMessage
	for {
		select {
		case msg := <-ps.recv:
			got = append(got, msg)
		case <-ps.closed:
			for {
				select {
				case msg := <-ps.recv:
					got = append(got, msg)
				default:
					return got
				}
			}
		case <-time.After(waitFor):
			ps.t.Fatal("worker did not close its stream")
			return nil
		}
	}
}

func TestWorkerRegistersHeartbeatsItsLoadAndDeregisters(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{
		WorkerID: "w-1", MachineID: "m-1", Concurrency: 3,
		HeartbeatInterval: 10 * time.Millisecond,
		Metadata:          map[string]any{"version": "1.2.3", "env": "test"},
		Logger:            quietLogger(),
	})
	require.NoError(t, err)
	require.Equal(t, "w-1", w.ID())
	release := make(chan struct{})
	w.MustRegisterAction("slow", func(*flo.ActionContext) ([]byte, error) {
		<-release
		return []byte(`"done"`), nil
	})
	w.MustRegisterAction("other", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	stop := runWorker(t, w)

	ps := p.accept(t)
	require.Equal(t, []string{"register w-1", "stream"}, p.registry.calls()[:2], "registered before opening the stream")
	reg := p.registry.registration("w-1")
	require.Equal(t, "myapp", reg.GetNamespace())
	require.Equal(t, flov1.WorkerType_WORKER_TYPE_ACTION, reg.GetWorkerType())
	require.Equal(t, int32(3), reg.GetMaxConcurrency())
	require.Equal(t, "m-1", reg.GetMachineId())
	require.JSONEq(t, `{"version":"1.2.3","env":"test"}`, reg.GetMetadata())
	require.Len(t, reg.GetProcesses(), 2)
	for i, name := range []string{"other", "slow"} {
		require.Equal(t, name, reg.GetProcesses()[i].GetName())
		require.Equal(t, flov1.ProcessKind_PROCESS_KIND_ACTION, reg.GetProcesses()[i].GetKind())
	}

	ps.handshake()
	require.Equal(t, int32(3), ps.nextReady().GetCount())
	ps.sendTasks(task("t-1", "slow", ""), task("t-2", "slow", ""))
	require.Eventually(t, func() bool { return slices.Contains(p.registry.loads(), 2) }, waitFor, time.Millisecond,
		"no heartbeat carried the two running handlers")
	close(release)
	ps.results(2)
	require.Eventually(t, func() bool {
		loads := p.registry.loads()
		return loads[len(loads)-1] == 0
	}, waitFor, time.Millisecond, "heartbeats did not show the handlers finished")

	require.NoError(t, stop())
	calls := p.registry.calls()
	require.Equal(t, "deregister w-1", calls[len(calls)-1])
	require.Equal(t, 1, p.registry.count("deregister w-1"))
	require.NoError(t, w.Close(), "closing after Start returned deregisters nothing more")
	require.Equal(t, 1, p.registry.count("deregister w-1"))
	require.Nil(t, p.registry.registration("w-1"))
}

// drainedWorker starts a worker with one running task of "slow" and a free slot for "fast"
// probes, and returns what the test needs to drive it.
func drainedWorker(t *testing.T, heartbeat time.Duration) (p *peer, ps *peerStream, release chan struct{}, done <-chan error) {
	t.Helper()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{
		WorkerID: "w-d", Concurrency: 2, HeartbeatInterval: heartbeat, Logger: quietLogger(),
	})
	require.NoError(t, err)
	started := make(chan struct{})
	release = make(chan struct{})
	w.MustRegisterAction("slow", func(actx *flo.ActionContext) ([]byte, error) {
		close(started)
		<-release
		return []byte(`"finished"`), nil
	})
	w.MustRegisterAction("fast", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	done = startWorker(t, w)
	ps = p.accept(t)
	ps.handshake()
	require.Equal(t, int32(2), ps.nextReady().GetCount())
	ps.sendTasks(task("t-1", "slow", ""))
	<-started
	return p, ps, release, done
}

// requireDrainedCleanly checks the end of a drain: the running task's result and nothing else
// (no Ready) after the point the worker knew, the stream closed, Start returned nil and the
// worker deregistered.
func requireDrainedCleanly(t *testing.T, p *peer, ps *peerStream, release chan struct{}, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("Start returned %v while a task was running", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	var results []*flov1.Result
	for _, msg := range ps.untilClosed() {
		require.Nil(t, msg.GetReady(), "a draining worker asked for work")
		require.NotNil(t, msg.GetResultBatch(), "want only results, got %v", msg)
		results = append(results, msg.GetResultBatch().GetResults()...)
	}
	require.Len(t, results, 1)
	require.Equal(t, "t-1", results[0].GetTaskId())
	require.Equal(t, `"finished"`, string(results[0].GetCompleted().GetBody()))
	require.NoError(t, requireReturns(t, done))
	calls := p.registry.calls()
	require.Equal(t, "deregister w-d", calls[len(calls)-1])
}

func TestWorkerDrainsWhenTheHeartbeatSaysDraining(t *testing.T) {
	t.Parallel()
	p, ps, release, done := drainedWorker(t, 10*time.Millisecond)
	p.registry.drain("w-d")
	// Until the worker has seen a heartbeat answered "draining", probes run as usual; from then
	// on, tasks a server still sends are handed back untouched.
	for i := 0; ; i++ {
		ps.sendTasks(task(fmt.Sprintf("probe-%d", i), "fast", ""))
		msg := ps.next()
		for msg.GetReady() != nil {
			msg = ps.next()
		}
		if msg.GetAbandon() != nil {
			require.Equal(t, fmt.Sprintf("probe-%d", i), msg.GetAbandon().GetTaskId())
			break
		}
		require.NotNil(t, msg.GetResultBatch(), "want a result or an abandon, got %v", msg)
		time.Sleep(5 * time.Millisecond)
	}
	requireDrainedCleanly(t, p, ps, release, done)
}

func TestWorkerDrainsOnTheStreamsDrainMessage(t *testing.T) {
	t.Parallel()
	// Heartbeats are far apart: the stream alone must do it.
	p, ps, release, done := drainedWorker(t, time.Hour)
	ps.send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_Drain{Drain: &flov1.Drain{}}})
	requireDrainedCleanly(t, p, ps, release, done)
	require.Zero(t, p.registry.count("heartbeat w-d"))
}

func TestWorkerRegistersAgainWhenTheRegistryForgetsIt(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{WorkerID: "w-r", HeartbeatInterval: 10 * time.Millisecond, Logger: quietLogger()})
	require.NoError(t, err)
	w.MustRegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	stop := runWorker(t, w)
	ps := p.accept(t)
	ps.handshake()
	ps.nextReady()
	require.Eventually(t, func() bool { return p.registry.count("heartbeat w-r") > 0 }, waitFor, time.Millisecond)
	require.Equal(t, 1, p.registry.count("register w-r"))

	p.registry.forget("w-r")
	require.Eventually(t, func() bool { return p.registry.registration("w-r") != nil }, waitFor, time.Millisecond,
		"the worker did not register again after a heartbeat got NotFound")
	require.Equal(t, 2, p.registry.count("register w-r"))
	require.NoError(t, stop())
	require.Nil(t, p.registry.registration("w-r"))
}

func TestWorkerRunsWhileTheRegistryIsUnavailable(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	p.registry.setRegisterErr(status.Error(codes.Unavailable, "registry restarting"))
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{WorkerID: "w-u", HeartbeatInterval: 10 * time.Millisecond, Logger: quietLogger()})
	require.NoError(t, err)
	w.MustRegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return []byte(`"ok"`), nil })
	stop := runWorker(t, w)

	ps := p.accept(t)
	ps.handshake()
	ps.nextReady()
	ps.sendTasks(task("t-1", "a", ""))
	results, _ := ps.results(1)
	require.Equal(t, `"ok"`, string(results["t-1"].GetCompleted().GetBody()))

	// Heartbeats find no record and register again until the registry takes it.
	require.Eventually(t, func() bool { return p.registry.count("register w-u") >= 3 }, waitFor, time.Millisecond)
	p.registry.setRegisterErr(nil)
	require.Eventually(t, func() bool { return p.registry.registration("w-u") != nil }, waitFor, time.Millisecond)
	require.NoError(t, stop())
}

func TestWorkerStartFailsWhenTheRegistryRefusesIt(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	p.registry.setRegisterErr(status.Error(codes.ResourceExhausted, "namespace myapp has 10000 workers, the limit is 10000"))
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{WorkerID: "w-x", Logger: quietLogger()})
	require.NoError(t, err)
	w.MustRegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	err = requireReturns(t, startWorker(t, w))
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "w-x")
	require.NotContains(t, p.registry.calls(), "stream", "a refused worker opened no stream")
}

// logRecorder keeps the log records a worker writes, for tests that check what it said.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r)
	return nil
}

func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// levels returns the levels of the records whose message contains text, in order.
func (l *logRecorder) levels(text string) []slog.Level {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Level
	for _, r := range l.records {
		if strings.Contains(r.Message, text) {
			out = append(out, r.Level)
		}
	}
	return out
}

// count counts the records at level whose message contains text.
func (l *logRecorder) count(level slog.Level, text string) int {
	n := 0
	for _, lv := range l.levels(text) {
		if lv == level {
			n++
		}
	}
	return n
}

// failingRegistration starts worker id against a registry failing its next n registrations
// with err and trailer (n zero: all of them), heartbeats far apart so that registering again
// is the retry's doing alone, and returns once the worker stream is open: the worker works
// while it is not registered yet.
func failingRegistration(t *testing.T, id string, n int, err error, trailer metadata.MD) (*peer, *logRecorder, func() error) {
	t.Helper()
	p, client := startPeer(t)
	p.registry.failRegistrations(n, err, trailer)
	logs := &logRecorder{}
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{WorkerID: id, HeartbeatInterval: time.Hour, Logger: slog.New(logs)})
	require.NoError(t, err)
	w.MustRegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	stop := runWorker(t, w)
	p.accept(t).handshake()
	return p, logs, stop
}

func TestWorkerRegistrationWaitsOutASlowOrOverloadedServer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		err     error
		trailer metadata.MD
	}{
		{name: "unavailable", err: status.Error(codes.Unavailable, "registry restarting")},
		{name: "deadline exceeded", err: status.Error(codes.DeadlineExceeded, "registry busy")},
		{name: "gateway over its rate", err: status.Error(codes.ResourceExhausted, "key k is over its rate of 10 calls/s"),
			trailer: metadata.Pairs("retry-after", "1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, logs, stop := failingRegistration(t, "w-s", 3, tc.err, tc.trailer)
			require.Eventually(t, func() bool { return p.registry.registration("w-s") != nil }, 2*waitFor, time.Millisecond,
				"the worker never registered")
			require.Equal(t, 4, p.registry.count("register w-s"))
			require.Zero(t, logs.count(slog.LevelWarn, ""), "three failed attempts logged a warning")
			require.NoError(t, stop())
		})
	}
}

func TestWorkerRegistrationFailuresWarnOncePerFewAttempts(t *testing.T) {
	t.Parallel()
	p, logs, stop := failingRegistration(t, "w-q", 0, status.Error(codes.Unavailable, "registry down"), nil)
	require.Eventually(t, func() bool { return p.registry.count("register w-q") >= 5 }, 2*waitFor, time.Millisecond)
	// The fifth attempt follows the fourth failure's warning; the next is due at the eighth.
	require.Equal(t, 1, logs.count(slog.LevelWarn, "registering the worker keeps failing"))
	require.Equal(t, 1, logs.count(slog.LevelWarn, ""))
	require.NoError(t, stop())
}

func TestWorkerReconnectsWarnOnBreakAndOncePerFewAttempts(t *testing.T) {
	t.Parallel()
	// Nothing listens there any more: every attempt fails at once.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	client := flo.NewClient(addr, flo.WithNamespace("myapp"))
	require.NoError(t, client.Connect())
	t.Cleanup(func() { _ = client.Close() })
	logs := &logRecorder{}
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{WorkerID: "w-r", Logger: slog.New(logs)})
	require.NoError(t, err)
	w.MustRegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	stop := runWorker(t, w)
	require.Eventually(t, func() bool { return len(logs.levels("worker stream down")) >= 4 }, waitFor, time.Millisecond)
	require.Equal(t, []slog.Level{slog.LevelWarn, slog.LevelDebug, slog.LevelDebug, slog.LevelWarn},
		logs.levels("worker stream down")[:4])
	require.NoError(t, stop())
}

func TestClientReadsAndDrainsWorkers(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	ctx := context.Background()

	list, err := client.ListWorkers(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Contains(t, p.registry.calls(), "list myapp")

	got, err := client.GetWorker(ctx, "w-9")
	require.NoError(t, err)
	require.Equal(t, list[0], got)
	require.Equal(t, flo.WorkerTypeAction, got.WorkerType)
	require.Equal(t, flo.WorkerDraining, got.Status)
	require.Equal(t, 5, got.MaxConcurrency)
	require.Equal(t, int64(7), got.Processes[0].RunCount)
	b, err := json.Marshal(got)
	require.NoError(t, err)
	require.JSONEq(t, `{
		"worker_id": "w-9", "namespace": "myapp", "worker_type": "action", "status": "draining",
		"max_concurrency": 5, "current_load": 2, "machine_id": "m-9",
		"metadata": {"version": "1.2.3"}, "tasks_completed": 7, "tasks_failed": 1,
		"processes": [{"name": "process-order", "kind": "action", "run_count": 7, "fail_count": 1,
			"last_run_at": "2026-01-02T03:04:05Z"}],
		"registered_at": "2026-01-02T03:00:00Z", "last_heartbeat": "2026-01-02T03:04:00Z"
	}`, string(b))

	_, err = client.GetWorker(ctx, "ghost")
	require.Equal(t, codes.NotFound, status.Code(err))
	require.True(t, strings.HasPrefix(err.Error(), "get worker ghost:"), err.Error())

	drained, err := client.DrainWorker(ctx, "w-9")
	require.NoError(t, err)
	require.Equal(t, flo.WorkerDraining, drained.Status)
	require.Contains(t, p.registry.calls(), "drain w-9")
	require.NoError(t, client.DeregisterWorker(ctx, "w-9"))
	require.Contains(t, p.registry.calls(), "deregister w-9")

}
