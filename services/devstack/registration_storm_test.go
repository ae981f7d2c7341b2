package devstack_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// logRecorder keeps every record the SDK's workers log.
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

// matching returns the messages of the records at level or above that pass keep.
func (l *logRecorder) matching(level slog.Level, keep func(msg string) bool) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		if r.Level >= level && keep(r.Message) {
			out = append(out, r.Level.String()+" "+r.Message)
		}
	}
	return out
}

// registrationTrouble is every record about registering that is a warning or worse, and every
// failed registration attempt at any level.
func (l *logRecorder) registrationTrouble() []string {
	return l.matching(slog.LevelDebug, func(msg string) bool {
		return strings.Contains(msg, "regist") && !strings.Contains(msg, "worker registered")
	})
}

// helloAcks collects, through a client interceptor, the ids of the workers whose stream the
// gateway accepted (its HelloAck reached the worker).
type helloAcks struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (h *helloAcks) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ids)
}

func (h *helloAcks) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids = map[string]bool{}
}

func (h *helloAcks) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != flov1.WorkerService_Stream_FullMethodName {
		return s, err
	}
	return &ackWatch{ClientStream: s, acks: h}, nil
}

// ackWatch is a worker stream whose HelloAck is recorded.
type ackWatch struct {
	grpc.ClientStream
	acks *helloAcks
}

func (w *ackWatch) RecvMsg(m any) error {
	err := w.ClientStream.RecvMsg(m)
	if msg, ok := m.(*flov1.ServerMessage); ok && err == nil && msg.GetHelloAck() != nil {
		w.acks.mu.Lock()
		w.acks.ids[msg.GetHelloAck().GetWorkerId()] = true
		w.acks.mu.Unlock()
	}
	return err
}

// stormWorkers lists the storm's workers in the registry, paging through all of them, by
// status.
func stormWorkers(t *testing.T, c *flo.Client) map[flo.WorkerStatus]int {
	t.Helper()
	list, err := c.ListWorkers(context.Background())
	require.NoError(t, err)
	out := map[flo.WorkerStatus]int{}
	for _, w := range list {
		if strings.HasPrefix(w.WorkerID, "storm-") {
			out[w.Status]++
		}
	}
	return out
}

// Two thousand workers starting at once all register, none refused and no attempt timed out,
// and all come back when the gateway restarts under them, still registered, without a
// registration error. They connect to "localhost", as the README has users do, over a few
// shared connections so that file descriptors suffice.
func TestRegistrationStormOfTwoThousandWorkers(t *testing.T) {
	const (
		workers = 2000
		conns   = 8
	)
	e := newEnv(t)
	ctx := context.Background()
	_, port, err := net.SplitHostPort(e.stack.GatewayGRPCAddr())
	require.NoError(t, err)
	addr := "localhost:" + port

	admin := e.client(t, "default")
	_, err = admin.RegisterAction(ctx, "storm", flo.ActionOptions{})
	require.NoError(t, err)

	logs := &logRecorder{}
	acks := &helloAcks{}
	acks.reset()
	clients := make([]*flo.Client, conns)
	for i := range clients {
		clients[i] = flo.NewClient(addr, flo.WithDialOptions(grpc.WithChainStreamInterceptor(acks.intercept)))
		require.NoError(t, clients[i].Connect())
	}
	runCtx, stop := context.WithCancel(ctx)
	var running sync.WaitGroup
	startErrs := make(chan error, workers)
	ready := make(chan struct{})
	for i := range workers {
		w, err := clients[i%conns].NewActionWorker(flo.ActionWorkerOptions{
			WorkerID: fmt.Sprintf("storm-%04d", i), Concurrency: 1, Logger: slog.New(logs),
		})
		require.NoError(t, err)
		w.MustRegisterAction("storm", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
		running.Go(func() {
			<-ready
			if err := w.Start(runCtx); err != nil {
				startErrs <- fmt.Errorf("worker %s: %w", w.ID(), err)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		running.Wait()
		for _, c := range clients {
			c.Close()
		}
	})
	close(ready) // all at once

	requireAll := func(phase string) {
		t.Helper()
		require.Eventually(t, func() bool {
			return len(startErrs) > 0 || acks.count() == workers
		}, 60*time.Second, 100*time.Millisecond, "%s: %d of %d worker streams accepted", phase, acks.count(), workers)
		require.Eventually(t, func() bool {
			listed := stormWorkers(t, admin)
			return len(startErrs) > 0 || listed[flo.WorkerIdle]+listed[flo.WorkerActive] == workers
		}, 60*time.Second, 250*time.Millisecond, "%s: registered %v", phase, stormWorkers(t, admin))
		require.Empty(t, startErrs, "%s: a worker stopped", phase)
		require.Empty(t, logs.registrationTrouble(), "%s: registering was refused, failed or timed out", phase)
	}
	requireAll("storm")
	require.Empty(t, logs.matching(slog.LevelWarn, func(string) bool { return true }), "the storm logged warnings")

	// Every stream breaks and reconnects to the new gateway.
	acks.reset()
	require.NoError(t, e.stack.RestartGateway(ctx))
	requireAll("after the gateway restart")
	require.Empty(t, logs.matching(slog.LevelError, func(string) bool { return true }), "errors after the gateway restart")
}
