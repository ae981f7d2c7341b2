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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/dispatcher/service"
)

// partitions is the task topics' partition count in these tests.
const partitions = 4

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

const (
	waitFor = 20 * time.Second
	tick    = 10 * time.Millisecond
)

// env is one running dispatcher on a fresh database and broker, with a gRPC
// client, a command producer and a recorder of every task event.
type env struct {
	svc      *service.Service
	client   dispatcherv1.DispatcherClient
	producer *kgo.Client
	events   *eventLog
}

func startEnv(t *testing.T) *env {
	t.Helper()
	broker := harness.NewBroker(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("flo_test_metric 1\n")) })
	r := startReplica(t, harness.NewDatabase(t), broker.Addrs(), service.WithMetricsHandler(metrics))
	t.Cleanup(r.stop)
	e := &env{svc: r.svc, client: r.client, producer: newProducer(t, broker.Addrs()), events: newEventLog()}
	e.events.start(t, broker.Addrs())
	return e
}

// replica is one running dispatcher and a client of it.
type replica struct {
	svc    *service.Service
	client dispatcherv1.DispatcherClient
	stop   func()
}

// startReplica runs a dispatcher on the given database and broker; stop
// shuts it down gracefully and checks that Run returned nil.
func startReplica(t testing.TB, dbURL string, brokers []string, opts ...service.Option) *replica {
	t.Helper()
	cfg := replicaConfig(dbURL, brokers)
	cfg.BootstrapNamespaces = []string{"default", " spaced "}
	cfg.Postgres.MaxConns = 8
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
				t.Error("dispatcher did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return &replica{svc: svc, client: dispatcherv1.NewDispatcherClient(conn), stop: stop}
}

func newProducer(t testing.TB, brokers []string) *kgo.Client {
	t.Helper()
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	return producer
}

// namespace creates a fresh namespace for one test.
func (e *env) namespace(t *testing.T) string {
	t.Helper()
	name := "ns-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	_, err := e.client.CreateNamespace(t.Context(), &flov1.CreateNamespaceRequest{Name: name})
	require.NoError(t, err)
	return name
}

// register registers an action with req's settings in ns.
func (e *env) register(t *testing.T, ns, name string, req *flov1.RegisterActionRequest) *flov1.Action {
	t.Helper()
	if req == nil {
		req = &flov1.RegisterActionRequest{}
	}
	req.Namespace, req.Name = ns, name
	a, err := e.client.RegisterAction(t.Context(), req)
	require.NoError(t, err)
	return a
}

// produce writes InvokeTask commands, filling ids and times, all with the
// same record key when key is set (so they land on one partition in order).
func (e *env) produce(t *testing.T, key string, headers []kgo.RecordHeader, cmds ...*eventsv1.InvokeTask) {
	t.Helper()
	recs := make([]*kgo.Record, len(cmds))
	for i, c := range cmds {
		if c.TaskId == "" {
			c.TaskId = uuid.NewString()
		}
		if c.EventId == "" {
			c.EventId = uuid.NewString()
		}
		if c.InvokedAt == nil {
			c.InvokedAt = timestamppb.Now()
		}
		value, err := proto.Marshal(c)
		require.NoError(t, err)
		k := key
		if k == "" {
			k = c.TaskId
		}
		recs[i] = &kgo.Record{Topic: kafka.CommandsTopic, Key: []byte(k), Value: value, Headers: headers}
	}
	require.NoError(t, e.producer.ProduceSync(t.Context(), recs...).FirstErr())
}

// invoke produces one command and waits until its task exists.
func (e *env) invoke(t *testing.T, ns, action string, payload string) string {
	t.Helper()
	cmd := &eventsv1.InvokeTask{Namespace: ns, Action: action, Payload: []byte(payload)}
	e.produce(t, "", nil, cmd)
	e.waitTask(t, ns, cmd.TaskId)
	return cmd.TaskId
}

// waitTask waits until the task exists and returns it.
func (e *env) waitTask(t *testing.T, ns, id string) *flov1.Task {
	t.Helper()
	var task *flov1.Task
	require.Eventually(t, func() bool {
		var err error
		task, err = e.client.GetTask(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: id})
		return err == nil
	}, waitFor, tick, "task %s never appeared", id)
	return task
}

func (e *env) task(t *testing.T, ns, id string) *flov1.Task {
	t.Helper()
	task, err := e.client.GetTask(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: id})
	require.NoError(t, err)
	return task
}

// waitStatus waits until the task has the given status and returns it.
func (e *env) waitStatus(t *testing.T, ns, id string, status flov1.TaskStatus) *flov1.Task {
	t.Helper()
	var task *flov1.Task
	require.Eventually(t, func() bool {
		task = e.task(t, ns, id)
		return task.GetStatus() == status
	}, waitFor, tick, "task %s never reached %s", id, status)
	return task
}

// claim claims for worker "w1".
func (e *env) claim(t *testing.T, ns string, actions []string, count int32, wait, lease time.Duration) []*flov1.TaskAssignment {
	t.Helper()
	resp, err := e.client.Claim(t.Context(), &dispatcherv1.ClaimRequest{
		Namespace: ns, Slots: []*dispatcherv1.ClaimSlot{{WorkerId: "w1", Count: count}}, Actions: actions,
		WaitMs: wait.Milliseconds(), LeaseMs: lease.Milliseconds(),
	})
	require.NoError(t, err)
	return resp.GetTasks()
}

// claimOne waits for exactly one task.
func (e *env) claimOne(t *testing.T, ns, action string, lease time.Duration) *flov1.TaskAssignment {
	t.Helper()
	got := e.claim(t, ns, []string{action}, 1, waitFor, lease)
	require.Len(t, got, 1)
	return got[0]
}

// report sends reports and returns the rejected ids.
func (e *env) report(t *testing.T, ns string, reports ...*dispatcherv1.Report) []string {
	t.Helper()
	resp, err := e.client.Report(t.Context(), &dispatcherv1.ReportRequest{Namespace: ns, WorkerId: "w1", Reports: reports})
	require.NoError(t, err)
	return resp.GetRejectedTaskIds()
}

func completed(a *flov1.TaskAssignment, body, outcome string) *dispatcherv1.Report {
	return &dispatcherv1.Report{TaskId: a.GetTaskId(), Attempt: a.GetAttempt(),
		Kind: &dispatcherv1.Report_Completed{Completed: &flov1.Completed{Body: []byte(body), Outcome: outcome}}}
}

func failed(a *flov1.TaskAssignment, msg string, retry, nonRetryable bool) *dispatcherv1.Report {
	return &dispatcherv1.Report{TaskId: a.GetTaskId(), Attempt: a.GetAttempt(),
		Kind: &dispatcherv1.Report_Failed{Failed: &flov1.Failed{Error: msg, Retry: retry, NonRetryable: nonRetryable}}}
}

// eventLog records every task event by task id, in log order.
type eventLog struct {
	mu     sync.Mutex
	byTask map[string][]*eventsv1.TaskEvent
	recs   map[string][]*kgo.Record
}

func newEventLog() *eventLog {
	return &eventLog{byTask: map[string][]*eventsv1.TaskEvent{}, recs: map[string][]*kgo.Record{}}
}

func (l *eventLog) start(t *testing.T, brokers []string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(kafka.TaskEventsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
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
				var ev eventsv1.TaskEvent
				// Lease extensions are the dispatcher's own bookkeeping,
				// which other consumers skip too.
				if err := proto.Unmarshal(r.Value, &ev); err != nil || ev.GetType() == eventsv1.TaskEventType_TASK_EVENT_TYPE_LEASE_EXTENDED {
					return
				}
				l.mu.Lock()
				l.byTask[ev.GetTaskId()] = append(l.byTask[ev.GetTaskId()], &ev)
				l.recs[ev.GetTaskId()] = append(l.recs[ev.GetTaskId()], r)
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

func (l *eventLog) of(id string) []*eventsv1.TaskEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*eventsv1.TaskEvent(nil), l.byTask[id]...)
}

func (l *eventLog) records(id string) []*kgo.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*kgo.Record(nil), l.recs[id]...)
}

func types(evs []*eventsv1.TaskEvent) []eventsv1.TaskEventType {
	out := make([]eventsv1.TaskEventType, len(evs))
	for i, ev := range evs {
		out[i] = ev.GetType()
	}
	return out
}

// waitEvents waits until the task's events are exactly want, in order.
func (l *eventLog) waitEvents(t *testing.T, id string, want ...eventsv1.TaskEventType) []*eventsv1.TaskEvent {
	t.Helper()
	require.Eventually(t, func() bool {
		got := types(l.of(id))
		if len(got) > len(want) {
			return true
		}
		return len(got) == len(want)
	}, waitFor, tick, "events of task %s: got %v, want %v", id, types(l.of(id)), want)
	evs := l.of(id)
	require.Equal(t, want, types(evs))
	return evs
}
