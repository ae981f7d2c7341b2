package flo_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// These tests hold the worker to the wire protocol of the worker stream: a scripted peer
// plays the gateway's side message by message, so each test says exactly what the worker must
// send and when. Running against the real platform is the job of the end-to-end tests.

const waitFor = 5 * time.Second

// peer is the server side of worker streams, driven by the test, with the worker registry
// beside it.
type peer struct {
	flov1.UnimplementedWorkerServiceServer
	streams  chan *peerStream
	registry *registryPeer
	// streamSvc plays the StreamService, which stream workers call to create their group.
	streamSvc *streamsPeer
}

// peerStream is one worker stream as the peer sees it.
type peerStream struct {
	t    *testing.T
	srv  grpc.BidiStreamingServer[flov1.WorkerMessage, flov1.ServerMessage]
	recv chan *flov1.WorkerMessage
	end  chan error
	// closed is closed when the worker closed its side of the stream.
	closed chan struct{}
}

func (p *peer) Stream(srv grpc.BidiStreamingServer[flov1.WorkerMessage, flov1.ServerMessage]) error {
	p.registry.record("stream")
	ps := &peerStream{
		srv:    srv,
		recv:   make(chan *flov1.WorkerMessage, 1024),
		end:    make(chan error, 1),
		closed: make(chan struct{}),
	}
	go func() {
		for {
			msg, err := srv.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					close(ps.closed)
				}
				return
			}
			ps.recv <- msg
		}
	}()
	select {
	case p.streams <- ps:
	case <-srv.Context().Done():
		return nil
	}
	select {
	case err := <-ps.end:
		return err
	case <-ps.closed:
		return nil
	case <-srv.Context().Done():
		return nil
	}
}

// startPeer serves a peer on loopback and returns it with a connected client.
func startPeer(t *testing.T) (*peer, *flo.Client) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &peer{streams: make(chan *peerStream, 4), registry: newRegistryPeer()}
	p.streamSvc = newStreamsPeer(p.registry.record)
	srv := grpc.NewServer()
	flov1.RegisterWorkerServiceServer(srv, p)
	flov1.RegisterWorkerRegistryServiceServer(srv, p.registry)
	flov1.RegisterStreamServiceServer(srv, p.streamSvc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	client := flo.NewClient(lis.Addr().String(), flo.WithNamespace("myapp"), flo.WithToken("secret"))
	require.NoError(t, client.Connect())
	t.Cleanup(func() { _ = client.Close() })
	return p, client
}

func (p *peer) accept(t *testing.T) *peerStream {
	t.Helper()
	select {
	case ps := <-p.streams:
		ps.t = t
		return ps
	case <-time.After(waitFor):
		t.Fatal("worker did not open a stream")
		return nil
	}
}

// handshake answers the worker's hello and returns it.
func (ps *peerStream) handshake() *flov1.Hello {
	ps.t.Helper()
	hello := ps.next().GetHello()
	require.NotNil(ps.t, hello, "first message must be a hello")
	ps.send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_HelloAck{HelloAck: &flov1.HelloAck{
		WorkerId: hello.GetWorkerId(), Namespace: hello.GetNamespace(),
	}}})
	return hello
}

func (ps *peerStream) next() *flov1.WorkerMessage {
	ps.t.Helper()
	select {
	case msg := <-ps.recv:
		return msg
	case <-time.After(waitFor):
		ps.t.Fatal("worker sent nothing")
		return nil
	}
}

// nextReady skips nothing: the next message must be a Ready.
func (ps *peerStream) nextReady() *flov1.Ready {
	ps.t.Helper()
	msg := ps.next()
	require.NotNil(ps.t, msg.GetReady(), "want Ready, got %v", msg)
	return msg.GetReady()
}

// results collects n results, which may come in one batch or several, and the credit asked
// for in Ready messages on the way.
func (ps *peerStream) results(n int) (map[string]*flov1.Result, int) {
	ps.t.Helper()
	got := map[string]*flov1.Result{}
	credit := 0
	for len(got) < n {
		msg := ps.next()
		switch m := msg.GetMsg().(type) {
		case *flov1.WorkerMessage_ResultBatch:
			for _, r := range m.ResultBatch.GetResults() {
				got[r.GetTaskId()] = r
			}
		case *flov1.WorkerMessage_Result:
			got[m.Result.GetTaskId()] = m.Result
		case *flov1.WorkerMessage_Ready:
			credit += int(m.Ready.GetCount())
		default:
			ps.t.Fatalf("want results, got %v", msg)
		}
	}
	return got, credit
}

func (ps *peerStream) send(msg *flov1.ServerMessage) {
	ps.t.Helper()
	require.NoError(ps.t, ps.srv.Send(msg))
}

func (ps *peerStream) sendTasks(tasks ...*flov1.TaskAssignment) {
	ps.t.Helper()
	ps.send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_TaskBatch{TaskBatch: &flov1.TaskBatch{Tasks: tasks}}})
}

func task(id, action string, payload string) *flov1.TaskAssignment {
	return &flov1.TaskAssignment{TaskId: id, Action: action, Payload: []byte(payload), Attempt: 1, MaxAttempts: 3}
}

// runWorker starts w and returns a function that stops it and returns what Start returned.
func runWorker(t *testing.T, w *flo.ActionWorker) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(waitFor):
				t.Fatal("Start did not return after its context ended")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestWorkerRunsTasksOverTheStream(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{
		WorkerID:    "w-1",
		MachineID:   "m-1",
		Concurrency: 3,
		BlockMS:     250,
		LeaseMS:     2000,
		Logger:      quietLogger(),
	})
	require.NoError(t, err)
	w.MustRegisterAction("process-order", func(actx *flo.ActionContext) ([]byte, error) {
		var order map[string]interface{}
		if err := actx.Into(&order); err != nil {
			return nil, err
		}
		return actx.Bytes(map[string]any{"status": "done", "id": order["id"], "attempt": actx.Attempt()})
	})
	w.MustRegisterAction("send-email", func(actx *flo.ActionContext) ([]byte, error) {
		return nil, nil
	})
	stop := runWorker(t, w)

	ps := p.accept(t)
	hello := ps.handshake()
	require.Equal(t, "secret", hello.GetToken())
	require.Equal(t, "w-1", hello.GetWorkerId())
	require.Equal(t, "myapp", hello.GetNamespace())
	require.Equal(t, "m-1", hello.GetMachineId())
	require.Equal(t, []string{"process-order", "send-email"}, hello.GetActions())
	require.Equal(t, int32(3), hello.GetMaxConcurrency())

	ready := ps.nextReady()
	require.Equal(t, []string{"process-order", "send-email"}, ready.GetActions())
	require.Equal(t, int32(3), ready.GetCount())
	require.Equal(t, int64(250), ready.GetBlockMs())
	require.Equal(t, int64(2000), ready.GetLeaseMs())

	ps.sendTasks(task("t-1", "process-order", `{"id":"o-1"}`), task("t-2", "send-email", ""), task("t-3", "process-order", `{"id":"o-3"}`))
	results, credit := ps.results(3)
	require.JSONEq(t, `{"status":"done","id":"o-1","attempt":1}`, string(results["t-1"].GetCompleted().GetBody()))
	require.NotNil(t, results["t-2"].GetCompleted())
	require.Empty(t, results["t-2"].GetCompleted().GetBody())
	require.JSONEq(t, `{"status":"done","id":"o-3","attempt":1}`, string(results["t-3"].GetCompleted().GetBody()))
	require.Equal(t, int32(1), results["t-1"].GetAttempt())
	for credit < 3 {
		credit += int(ps.nextReady().GetCount())
	}
	require.Equal(t, 3, credit, "every freed slot is asked for again, once")

	require.NoError(t, stop())
}

// Reports wait a moment while handlers still run, to go out together, but a handler that keeps
// running holds back no one else's report.
func TestWorkerReportsWhileAHandlerKeepsRunning(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 3, Logger: quietLogger()})
	require.NoError(t, err)
	stuck := make(chan struct{})
	w.MustRegisterAction("a", func(actx *flo.ActionContext) ([]byte, error) {
		if actx.TaskID() == "t-1" {
			<-stuck
		}
		return nil, nil
	})
	runWorker(t, w)
	ps := p.accept(t)
	ps.handshake()
	ps.nextReady()
	ps.sendTasks(task("t-1", "a", ""), task("t-2", "a", ""), task("t-3", "a", ""))
	results, _ := ps.results(2)
	require.Contains(t, results, "t-2")
	require.Contains(t, results, "t-3")
	close(stuck)
	results, _ = ps.results(1)
	require.Contains(t, results, "t-1")
}

func TestWorkerReportsEachKindOfEnding(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 8, Logger: quietLogger()})
	require.NoError(t, err)
	w.MustRegisterAction("fail", func(*flo.ActionContext) ([]byte, error) { return nil, errors.New("db down") })
	w.MustRegisterAction("panic", func(*flo.ActionContext) ([]byte, error) { panic("boom") })
	w.MustRegisterAction("validate", func(*flo.ActionContext) (interface{}, error) {
		return nil, flo.NewNonRetryableErrorf("missing orderId")
	})
	w.MustRegisterAction("dead-letter", func(*flo.ActionContext) ([]byte, error) {
		return nil, flo.NewDeadLetterErrorf("card declined")
	})
	w.MustRegisterAction("timeout", func(actx *flo.ActionContext) ([]byte, error) {
		ctx, cancel := context.WithTimeout(actx, time.Millisecond)
		defer cancel()
		<-ctx.Done()
		return nil, ctx.Err()
	})
	w.MustRegisterAction("review", func(actx *flo.ActionContext) (interface{}, error) {
		return actx.Result("needs_review", map[string]string{"note": "manual"})
	})
	w.MustRegisterAction("abandon", func(*flo.ActionContext) ([]byte, error) { return nil, flo.ErrAbandon })
	w.MustRegisterAction("nack", func(*flo.ActionContext) ([]byte, error) {
		return nil, flo.NewNackErrorf(2*time.Second, "rate limited")
	})
	runWorker(t, w)

	ps := p.accept(t)
	ps.handshake()
	require.Equal(t, int32(8), ps.nextReady().GetCount())
	ps.sendTasks(task("fail", "fail", ""), task("panic", "panic", ""), task("validate", "validate", ""),
		task("dead-letter", "dead-letter", ""), task("timeout", "timeout", ""), task("review", "review", ""),
		task("abandon", "abandon", ""), task("nack", "nack", ""))

	results := map[string]*flov1.Result{}
	var abandon *flov1.Abandon
	var nack *flov1.Nack
	for len(results) < 6 || abandon == nil || nack == nil {
		msg := ps.next()
		switch m := msg.GetMsg().(type) {
		case *flov1.WorkerMessage_ResultBatch:
			for _, r := range m.ResultBatch.GetResults() {
				results[r.GetTaskId()] = r
			}
		case *flov1.WorkerMessage_Abandon:
			abandon = m.Abandon
		case *flov1.WorkerMessage_Nack:
			nack = m.Nack
		case *flov1.WorkerMessage_Ready:
		default:
			t.Fatalf("unexpected %v", msg)
		}
	}
	requireFailed(t, results["fail"], "db down", true, false)
	requireFailed(t, results["panic"], "panic: boom", true, false)
	requireFailed(t, results["validate"], "missing orderId", false, true)
	requireFailed(t, results["dead-letter"], "card declined", false, false)
	requireFailed(t, results["timeout"], "context deadline exceeded", false, true)
	require.Equal(t, "needs_review", results["review"].GetCompleted().GetOutcome())
	require.JSONEq(t, `{"note":"manual"}`, string(results["review"].GetCompleted().GetBody()))
	require.Equal(t, "abandon", abandon.GetTaskId())
	require.Equal(t, int32(1), abandon.GetAttempt())
	require.Equal(t, "nack", nack.GetTaskId())
	require.Equal(t, int64(2000), nack.GetDelayMs())
	require.Equal(t, "rate limited", nack.GetReason())
}

func requireFailed(t *testing.T, r *flov1.Result, msg string, retry, nonRetryable bool) {
	t.Helper()
	require.NotNil(t, r.GetFailed(), "want a failure, got %v", r)
	require.Equal(t, msg, r.GetFailed().GetError())
	require.Equal(t, retry, r.GetFailed().GetRetry(), "retry")
	require.Equal(t, nonRetryable, r.GetFailed().GetNonRetryable(), "non_retryable")
}

func TestWorkerAsksAgainWhenAnEmptyBatchReturnsCredit(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 4, BlockMS: 100, Logger: quietLogger()})
	require.NoError(t, err)
	w.MustRegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	runWorker(t, w)

	ps := p.accept(t)
	ps.handshake()
	require.Equal(t, int32(4), ps.nextReady().GetCount())
	ps.sendTasks(task("t-1", "a", ""))
	_, credit := ps.results(1)
	for credit < 1 {
		credit += int(ps.nextReady().GetCount())
	}
	require.Equal(t, 1, credit)

	// The server holds two grants now: 3 left of the first Ready and the 1 just asked for.
	// Each expiry answers one grant, oldest first, and the worker asks for exactly that again.
	ps.sendTasks()
	require.Equal(t, int32(3), ps.nextReady().GetCount())
	ps.sendTasks()
	require.Equal(t, int32(1), ps.nextReady().GetCount())
	ps.sendTasks(task("t-2", "a", ""), task("t-3", "a", ""), task("t-4", "a", ""), task("t-5", "a", ""))
	_, credit = ps.results(4)
	for credit < 4 {
		credit += int(ps.nextReady().GetCount())
	}
	require.Equal(t, 4, credit)
}

func TestWorkerTouchWaitsForTheAnswer(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Logger: quietLogger()})
	require.NoError(t, err)
	touched := make(chan error, 2)
	w.MustRegisterAction("report", func(actx *flo.ActionContext) ([]byte, error) {
		touched <- actx.Touch(30000)
		touched <- actx.Touch(30000)
		return []byte(`"ok"`), nil
	})
	runWorker(t, w)

	ps := p.accept(t)
	ps.handshake()
	ps.nextReady()
	ps.sendTasks(&flov1.TaskAssignment{TaskId: "t-1", Action: "report", Attempt: 2})

	touch := ps.next().GetTouch()
	require.Equal(t, &flov1.Touch{TaskId: "t-1", Attempt: 2, ExtendMs: 30000}, &flov1.Touch{
		TaskId: touch.GetTaskId(), Attempt: touch.GetAttempt(), ExtendMs: touch.GetExtendMs(),
	})
	select {
	case err := <-touched:
		t.Fatalf("Touch returned %v before the answer", err)
	case <-time.After(50 * time.Millisecond):
	}
	ps.send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_TouchAck{TouchAck: &flov1.TouchAck{TaskId: "t-1", Ok: true}}})
	require.NoError(t, <-touched)

	require.NotNil(t, ps.next().GetTouch())
	ps.send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_TouchAck{TouchAck: &flov1.TouchAck{
		TaskId: "t-1", Ok: false, Error: "lease expired",
	}}})
	require.EqualError(t, <-touched, "touch task t-1: lease expired")
	results, _ := ps.results(1)
	require.Equal(t, `"ok"`, string(results["t-1"].GetCompleted().GetBody()))
}

func TestWorkerAppliesBackPressure(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 2, Logger: quietLogger()})
	require.NoError(t, err)
	var running, peak atomic.Int32
	release := make(chan struct{})
	w.MustRegisterAction("a", func(*flo.ActionContext) ([]byte, error) {
		n := running.Add(1)
		for {
			old := peak.Load()
			if n <= old || peak.CompareAndSwap(old, n) {
				break
			}
		}
		<-release
		running.Add(-1)
		return nil, nil
	})
	runWorker(t, w)

	ps := p.accept(t)
	ps.handshake()
	require.Equal(t, int32(2), ps.nextReady().GetCount())
	// A server that ignores the credit and sends five tasks still gets at most two running.
	ps.sendTasks(task("t-1", "a", ""), task("t-2", "a", ""), task("t-3", "a", ""), task("t-4", "a", ""), task("t-5", "a", ""))
	require.Eventually(t, func() bool { return running.Load() == 2 }, waitFor, time.Millisecond)
	close(release)
	results, _ := ps.results(5)
	require.Len(t, results, 5)
	require.Equal(t, int32(2), peak.Load())
}

func TestWorkerContinuesTraceOfTheInvocation(t *testing.T) {
	// Not parallel: it installs the global propagator.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator()) })

	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Logger: quietLogger()})
	require.NoError(t, err)
	type seen struct{ id, trace string }
	spans := make(chan seen, 3)
	w.MustRegisterAction("a", func(actx *flo.ActionContext) ([]byte, error) {
		spans <- seen{actx.TaskID(), trace.SpanContextFromContext(actx).TraceID().String()}
		return nil, nil
	})
	runWorker(t, w)

	ps := p.accept(t)
	ps.handshake()
	ps.nextReady()
	// The tasks of one InvokeMany share its trace context; each task continues the trace
	// it carries.
	const first, second = "4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c"
	var tasks []*flov1.TaskAssignment
	for i, traceID := range []string{first, first, second} {
		tk := task(fmt.Sprintf("t-%d", i), "a", "")
		tk.TraceContext = map[string]string{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}
		tasks = append(tasks, tk)
	}
	ps.sendTasks(tasks...)
	got := map[string]string{}
	for range tasks {
		sc := <-spans
		got[sc.id] = sc.trace
	}
	require.Equal(t, map[string]string{"t-0": first, "t-1": first, "t-2": second}, got)
	results, _ := ps.results(len(tasks))
	for _, tk := range tasks {
		require.Equal(t, tk.TraceContext, results[tk.GetTaskId()].GetTraceContext(), "no span was made here: the result carries the invocation's context")
	}
}

func TestWorkerReconnectsAndDeliversResultsOfRunningTasks(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 3, Logger: quietLogger()})
	require.NoError(t, err)
	started := make(chan struct{})
	release := make(chan struct{})
	w.MustRegisterAction("slow", func(actx *flo.ActionContext) ([]byte, error) {
		close(started)
		<-release
		return []byte(`"late"`), actx.Err()
	})
	runWorker(t, w)

	first := p.accept(t)
	first.handshake()
	first.nextReady()
	first.sendTasks(task("t-1", "slow", ""))
	<-started
	first.end <- status.Error(codes.Unavailable, "gateway restarting")

	second := p.accept(t)
	second.handshake()
	require.Equal(t, int32(2), second.nextReady().GetCount(), "the running task keeps its slot")
	close(release)
	results, _ := second.results(1)
	require.Equal(t, `"late"`, string(results["t-1"].GetCompleted().GetBody()),
		"the handler outlived its stream and its result went out on the new one")
}

func TestWorkerStopFinishesRunningTasks(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 2, Logger: quietLogger()})
	require.NoError(t, err)
	started := make(chan struct{})
	release := make(chan struct{})
	w.MustRegisterAction("slow", func(actx *flo.ActionContext) ([]byte, error) {
		close(started)
		<-release
		// The handler's context outlives the worker's: stopping lets handlers finish.
		return []byte(`"finished"`), actx.Err()
	})
	w.MustRegisterAction("fast", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	stop := runWorker(t, w)

	ps := p.accept(t)
	ps.handshake()
	require.Equal(t, int32(2), ps.nextReady().GetCount())
	ps.sendTasks(task("t-1", "slow", ""))
	<-started

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// Tasks the server hands out once the worker has seen the stop are given back untouched;
	// until then they run as usual.
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
	}
	select {
	case err := <-stopped:
		t.Fatalf("Start returned %v while a task was running", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	results, credit := ps.results(1)
	require.Equal(t, `"finished"`, string(results["t-1"].GetCompleted().GetBody()))
	require.Zero(t, credit, "a stopping worker asks for nothing")
	select {
	case <-ps.closed:
	case <-time.After(waitFor):
		t.Fatal("worker did not close its stream")
	}
	require.NoError(t, <-stopped)
}

func TestWorkerCloseStopsStart(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Logger: quietLogger()})
	require.NoError(t, err)
	w.MustRegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	done := make(chan error, 1)
	go func() { done <- w.Start(context.Background()) }()
	ps := p.accept(t)
	ps.handshake()
	ps.nextReady()
	require.NoError(t, w.Close())
	require.NoError(t, <-done)
	require.ErrorIs(t, w.Start(context.Background()), flo.ErrWorkerClosed)
	require.NoError(t, w.Close())
}

func TestWorkerStartFailsWhenRefused(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Logger: quietLogger()})
	require.NoError(t, err)
	w.MustRegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	done := make(chan error, 1)
	go func() { done <- w.Start(context.Background()) }()
	ps := p.accept(t)
	require.NotNil(t, ps.next().GetHello())
	ps.end <- status.Error(codes.Unauthenticated, "bad token")
	select {
	case err := <-done:
		require.Equal(t, codes.Unauthenticated, status.Code(err))
	case <-time.After(waitFor):
		t.Fatal("Start kept retrying a refused worker")
	}
}

func TestWorkerRegistrationRules(t *testing.T) {
	t.Parallel()
	client := flo.NewClient("127.0.0.1:1")
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{})
	require.NoError(t, err)
	opts := w.Options()
	require.Equal(t, 10, opts.Concurrency)
	require.Equal(t, 5*time.Minute, opts.ActionTimeout)
	require.Equal(t, int64(300000), opts.BlockMS)
	require.Zero(t, opts.LeaseMS)
	require.Equal(t, 30*time.Second, opts.HeartbeatInterval)
	require.Equal(t, opts.WorkerID, w.ID())
	require.Regexp(t, `^.+-[0-9a-f]{8}$`, opts.WorkerID)
	require.NotEmpty(t, opts.MachineID)

	require.ErrorContains(t, w.Start(context.Background()), "no actions registered")
	require.NoError(t, w.RegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return nil, nil }))
	require.ErrorContains(t, w.RegisterAction("a", func(*flo.ActionContext) ([]byte, error) { return nil, nil }), "already registered")
	require.Error(t, w.RegisterAction("", func(*flo.ActionContext) ([]byte, error) { return nil, nil }))
	var unsupported *flo.UnsupportedHandlerError
	require.ErrorAs(t, w.RegisterAction("b", func(*flo.ActionContext) error { return nil }), &unsupported)
	require.Panics(t, func() { w.MustRegisterAction("c", 42) })
	require.ErrorIs(t, w.Start(context.Background()), flo.ErrNotConnected)

	_, err = client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: -1})
	require.Error(t, err)
	_, err = client.NewActionWorker(flo.ActionWorkerOptions{HeartbeatInterval: -time.Second})
	require.Error(t, err)
	_, err = client.NewActionWorker(flo.ActionWorkerOptions{Metadata: map[string]any{"callback": func() {}}})
	require.ErrorContains(t, err, "worker metadata")
}
