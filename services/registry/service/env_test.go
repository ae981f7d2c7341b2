package service_test

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/registry/service"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

const (
	waitFor = 20 * time.Second
	tick    = 10 * time.Millisecond
)

// replica is one running registry and a client of it.
type replica struct {
	svc    *service.Service
	client registryv1.RegistryClient
	stop   func()
}

// testConfig is a registry on dbURL and brokers that never marks a worker
// unhealthy within a test, with a namespace limit of 3.
func testConfig(dbURL string, brokers []string) service.Config {
	return service.Config{
		GRPCAddr:               "127.0.0.1:0",
		HTTPAddr:               "127.0.0.1:0",
		HeartbeatTimeout:       time.Hour,
		HealthCheckInterval:    50 * time.Millisecond,
		MaxWorkersPerNamespace: 3,
		Postgres:               config.Postgres{URL: dbURL, MaxConns: 8},
		Kafka:                  config.Kafka{Brokers: brokers, Partitions: 4},
		Auth:                   harness.InternalAuth(),
	}
}

// startReplica runs a registry; stop shuts it down gracefully and checks
// that Run returned nil.
func startReplica(t testing.TB, cfg service.Config, opts ...service.Option) *replica {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := service.New(ctx, cfg, log, opts...)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	conn := harness.DialInternal(t, svc.GRPCAddr())
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = conn.Close()
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(time.Minute):
				t.Error("registry did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return &replica{svc: svc, client: registryv1.NewRegistryClient(conn), stop: stop}
}

// env is a registry on a fresh database and broker, a producer of task
// events and a recorder of every worker event.
type env struct {
	*replica
	cfg      service.Config
	producer *kgo.Client
	events   *eventLog
}

func startEnv(t *testing.T, adjust func(*service.Config), opts ...service.Option) *env {
	t.Helper()
	broker := harness.NewBroker(t)
	cfg := testConfig(harness.NewDatabase(t), broker.Addrs())
	if adjust != nil {
		adjust(&cfg)
	}
	e := &env{replica: startReplica(t, cfg, opts...), cfg: cfg, producer: newProducer(t, broker.Addrs()), events: newEventLog()}
	e.events.start(t, broker.Addrs())
	return e
}

func newProducer(t testing.TB, brokers []string) *kgo.Client {
	t.Helper()
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	return producer
}

// namespace names a fresh namespace for one test; the registry trusts the
// gateway to have checked it exists.
func namespace() string {
	return "ns-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
}

func register(t *testing.T, c registryv1.RegistryClient, req *flov1.RegisterWorkerRequest) *flov1.Worker {
	t.Helper()
	if req.WorkerType == flov1.WorkerType_WORKER_TYPE_UNSPECIFIED {
		req.WorkerType = flov1.WorkerType_WORKER_TYPE_ACTION
	}
	w, err := c.RegisterWorker(t.Context(), req)
	require.NoError(t, err)
	return w
}

func heartbeat(t *testing.T, c registryv1.RegistryClient, ns, id string, load int32) flov1.WorkerStatus {
	t.Helper()
	resp, err := c.Heartbeat(t.Context(), &flov1.HeartbeatRequest{Namespace: ns, WorkerId: id, CurrentLoad: load})
	require.NoError(t, err)
	return resp.GetStatus()
}

func getWorker(t *testing.T, c registryv1.RegistryClient, ns, id string) *flov1.Worker {
	t.Helper()
	w, err := c.GetWorker(t.Context(), &flov1.GetWorkerRequest{Namespace: ns, WorkerId: id})
	require.NoError(t, err)
	return w
}

// waitStatus waits until the worker has status st.
func waitStatus(t *testing.T, c registryv1.RegistryClient, ns, id string, st flov1.WorkerStatus) {
	t.Helper()
	require.Eventually(t, func() bool {
		return getWorker(t, c, ns, id).GetStatus() == st
	}, waitFor, tick, "worker %s/%s never became %s", ns, id, st)
}

func requireCode(t *testing.T, want codes.Code, err error, msgContains string) {
	t.Helper()
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status: %v", err)
	require.Equal(t, want, st.Code(), st.Message())
	require.Contains(t, st.Message(), msgContains)
}

// eventLog records every worker event by record key, in log order.
type eventLog struct {
	mu    sync.Mutex
	byKey map[string][]*eventsv1.WorkerEvent
}

func newEventLog() *eventLog { return &eventLog{byKey: map[string][]*eventsv1.WorkerEvent{}} }

func (l *eventLog) start(t *testing.T, brokers []string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(kafka.WorkerEventsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			fetches := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			fetches.EachRecord(func(r *kgo.Record) {
				var ev eventsv1.WorkerEvent
				if err := proto.Unmarshal(r.Value, &ev); err != nil {
					t.Errorf("undecodable worker event at offset %d: %v", r.Offset, err)
					return
				}
				if string(r.Key) != ev.GetNamespace()+"/"+ev.GetWorkerId() {
					t.Errorf("worker event keyed %q for %s/%s", r.Key, ev.GetNamespace(), ev.GetWorkerId())
				}
				l.mu.Lock()
				l.byKey[string(r.Key)] = append(l.byKey[string(r.Key)], &ev)
				l.mu.Unlock()
			})
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		cl.Close()
	})
}

func (l *eventLog) of(ns, id string) []*eventsv1.WorkerEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*eventsv1.WorkerEvent(nil), l.byKey[ns+"/"+id]...)
}

// change is the part of a worker event a test compares.
type change struct {
	Type eventsv1.WorkerEventType
	From flov1.WorkerStatus
	To   flov1.WorkerStatus
}

func changes(evs []*eventsv1.WorkerEvent) []change {
	out := make([]change, len(evs))
	for i, ev := range evs {
		out[i] = change{ev.GetType(), ev.GetPreviousStatus(), ev.GetStatus()}
	}
	return out
}

// waitEvents waits until the worker's events are exactly want, in order.
func (l *eventLog) waitEvents(t *testing.T, ns, id string, want ...change) {
	t.Helper()
	require.Eventually(t, func() bool {
		return len(l.of(ns, id)) >= len(want)
	}, waitFor, tick, "events of %s/%s: got %v, want %v", ns, id, changes(l.of(ns, id)), want)
	require.Equal(t, want, changes(l.of(ns, id)))
}

// waitEventsPrefix waits until the worker's events begin with want.
func (l *eventLog) waitEventsPrefix(t *testing.T, ns, id string, want ...change) {
	t.Helper()
	require.Eventually(t, func() bool {
		return len(l.of(ns, id)) >= len(want)
	}, waitFor, tick, "events of %s/%s: got %v, want %v", ns, id, changes(l.of(ns, id)), want)
	require.Equal(t, want, changes(l.of(ns, id))[:len(want)])
}

const (
	stActive    = flov1.WorkerStatus_WORKER_STATUS_ACTIVE
	stIdle      = flov1.WorkerStatus_WORKER_STATUS_IDLE
	stDraining  = flov1.WorkerStatus_WORKER_STATUS_DRAINING
	stUnhealthy = flov1.WorkerStatus_WORKER_STATUS_UNHEALTHY
	stNone      = flov1.WorkerStatus_WORKER_STATUS_UNSPECIFIED

	evRegistered   = eventsv1.WorkerEventType_WORKER_EVENT_TYPE_REGISTERED
	evChanged      = eventsv1.WorkerEventType_WORKER_EVENT_TYPE_STATUS_CHANGED
	evDeregistered = eventsv1.WorkerEventType_WORKER_EVENT_TYPE_DEREGISTERED
)

// metricsStub stands in for the telemetry handler.
var metricsStub = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	_, _ = w.Write([]byte("flo_test_metric 1\n"))
})

func withMetrics() service.Option { return service.WithMetricsHandler(metricsStub) }
