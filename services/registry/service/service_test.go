package service_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestRegistry runs the behaviour tests against one registry; each subtest
// owns a namespace, so they run in parallel.
func TestRegistry(t *testing.T) {
	e := startEnv(t, nil, withMetrics())
	t.Run("lifecycle", func(t *testing.T) { t.Parallel(); testLifecycle(t, e) })
	t.Run("register and list", func(t *testing.T) { t.Parallel(); testRegisterAndList(t, e) })
	t.Run("re-register replaces", func(t *testing.T) { t.Parallel(); testReRegister(t, e) })
	t.Run("bad input", func(t *testing.T) { t.Parallel(); testBadInput(t, e) })
	t.Run("namespace limit", func(t *testing.T) { t.Parallel(); testNamespaceLimit(t, e) })
	t.Run("task counters", func(t *testing.T) { t.Parallel(); testCounters(t, e) })
	t.Run("http", func(t *testing.T) { t.Parallel(); testHTTP(t, e) })
	t.Run("batched heartbeats", func(t *testing.T) { t.Parallel(); testHeartbeats(t, e) })
}

func testLifecycle(t *testing.T, e *env) {
	ctx := t.Context()
	ns := namespace()
	w := register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "w1"})
	require.Equal(t, stActive, w.GetStatus())

	require.Equal(t, stActive, heartbeat(t, e.client, ns, "w1", 2))
	require.Equal(t, int32(2), getWorker(t, e.client, ns, "w1").GetCurrentLoad())
	require.Equal(t, stIdle, heartbeat(t, e.client, ns, "w1", 0))
	require.Equal(t, stActive, heartbeat(t, e.client, ns, "w1", 1))

	drained, err := e.client.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: "w1"})
	require.NoError(t, err)
	require.Equal(t, stDraining, drained.GetStatus())
	again, err := e.client.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: "w1"})
	require.NoError(t, err, "drain is idempotent")
	require.Equal(t, stDraining, again.GetStatus())
	// Draining is sticky whatever the load.
	require.Equal(t, stDraining, heartbeat(t, e.client, ns, "w1", 3))
	require.Equal(t, stDraining, heartbeat(t, e.client, ns, "w1", 0))
	require.Equal(t, stDraining, getWorker(t, e.client, ns, "w1").GetStatus())

	_, err = e.client.DeregisterWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: "w1"})
	require.NoError(t, err)
	_, err = e.client.GetWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: "w1"})
	requireCode(t, codes.NotFound, err, "worker w1 not found in namespace "+ns)
	_, err = e.client.Heartbeat(ctx, &flov1.HeartbeatRequest{Namespace: ns, WorkerId: "w1"})
	requireCode(t, codes.NotFound, err, "worker w1 not found")
	_, err = e.client.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: "w1"})
	requireCode(t, codes.NotFound, err, "worker w1 not found")
	_, err = e.client.DeregisterWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: "w1"})
	require.NoError(t, err, "deregistering an unknown worker succeeds")

	e.events.waitEvents(t, ns, "w1",
		change{evRegistered, stNone, stActive},
		change{evChanged, stActive, stIdle},
		change{evChanged, stIdle, stActive},
		change{evChanged, stActive, stDraining},
		change{evDeregistered, stDraining, stNone},
	)
}

func testRegisterAndList(t *testing.T, e *env) {
	ctx := t.Context()
	ns := namespace()
	before := time.Now().Add(-time.Minute)
	w := register(t, e.client, &flov1.RegisterWorkerRequest{
		Namespace: ns, WorkerId: "b-worker", WorkerType: flov1.WorkerType_WORKER_TYPE_STREAM,
		MaxConcurrency: 4, MachineId: "host-1", Metadata: ` {"version": "1.2", "labels": {"env": "dev"}} `,
		Processes: []*flov1.WorkerProcess{{Name: "orders/billing"}, {Name: "audit", Kind: flov1.ProcessKind_PROCESS_KIND_ACTION}, {Name: "events/all", RunCount: 99}},
	})
	require.Equal(t, "b-worker", w.GetWorkerId())
	require.Equal(t, ns, w.GetNamespace())
	require.Equal(t, flov1.WorkerType_WORKER_TYPE_STREAM, w.GetWorkerType())
	require.Equal(t, int32(4), w.GetMaxConcurrency())
	require.Equal(t, "host-1", w.GetMachineId())
	require.JSONEq(t, `{"version": "1.2", "labels": {"env": "dev"}}`, w.GetMetadata())
	require.True(t, w.GetRegisteredAt().AsTime().After(before))
	require.True(t, w.GetLastHeartbeat().AsTime().After(before))
	wantProcesses := []*flov1.WorkerProcess{
		{Name: "audit", Kind: flov1.ProcessKind_PROCESS_KIND_ACTION},
		{Name: "events/all", Kind: flov1.ProcessKind_PROCESS_KIND_STREAM_CONSUMER},
		{Name: "orders/billing", Kind: flov1.ProcessKind_PROCESS_KIND_STREAM_CONSUMER},
	}
	requireProcesses(t, wantProcesses, w.GetProcesses())
	got := getWorker(t, e.client, ns, "b-worker")
	require.True(t, proto.Equal(w, got), "get returns what register returned:\n%v\n%v", w, got)

	// Defaults: made-up id, concurrency 10, no metadata, no processes.
	auto := register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns})
	require.Regexp(t, regexp.MustCompile(`^worker-[0-9a-f]{8}$`), auto.GetWorkerId())
	require.Equal(t, int32(10), auto.GetMaxConcurrency())
	require.Empty(t, auto.GetMetadata())
	require.Empty(t, auto.GetProcesses())
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "a-worker", Processes: []*flov1.WorkerProcess{{Name: "send"}}})

	list, err := e.client.ListWorkers(ctx, &flov1.ListWorkersRequest{Namespace: ns})
	require.NoError(t, err)
	ids := make([]string, len(list.GetWorkers()))
	for i, lw := range list.GetWorkers() {
		ids[i] = lw.GetWorkerId()
	}
	require.Equal(t, []string{"a-worker", "b-worker", auto.GetWorkerId()}, ids)
	requireProcesses(t, []*flov1.WorkerProcess{{Name: "send", Kind: flov1.ProcessKind_PROCESS_KIND_ACTION}}, list.GetWorkers()[0].GetProcesses())
	requireProcesses(t, wantProcesses, list.GetWorkers()[1].GetProcesses())

	empty, err := e.client.ListWorkers(ctx, &flov1.ListWorkersRequest{Namespace: namespace()})
	require.NoError(t, err)
	require.Empty(t, empty.GetWorkers())
}

func requireProcesses(t *testing.T, want, got []*flov1.WorkerProcess) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		require.True(t, proto.Equal(want[i], got[i]), "process %d: want %v, got %v", i, want[i], got[i])
	}
}

func testReRegister(t *testing.T, e *env) {
	ctx := t.Context()
	ns := namespace()
	first := register(t, e.client, &flov1.RegisterWorkerRequest{
		Namespace: ns, WorkerId: "w", MaxConcurrency: 2, Metadata: `{"v":1}`,
		Processes: []*flov1.WorkerProcess{{Name: "old"}},
	})
	e.produceTaskEvents(t, "k", taskEvent(ns, "w", "old", eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED))
	require.Eventually(t, func() bool { return getWorker(t, e.client, ns, "w").GetTasksCompleted() == 1 }, waitFor, tick)
	_, err := e.client.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: "w"})
	require.NoError(t, err)
	heartbeat(t, e.client, ns, "w", 2)

	second := register(t, e.client, &flov1.RegisterWorkerRequest{
		Namespace: ns, WorkerId: "w", MaxConcurrency: 5, MachineId: "m2",
		Processes: []*flov1.WorkerProcess{{Name: "new-a"}, {Name: "new-b"}},
	})
	require.Equal(t, stActive, second.GetStatus(), "a new registration is no longer draining")
	require.Equal(t, int32(5), second.GetMaxConcurrency())
	require.Equal(t, "m2", second.GetMachineId())
	require.Empty(t, second.GetMetadata())
	require.Zero(t, second.GetCurrentLoad())
	require.Zero(t, second.GetTasksCompleted())
	require.False(t, second.GetRegisteredAt().AsTime().Before(first.GetRegisteredAt().AsTime()))
	requireProcesses(t, []*flov1.WorkerProcess{
		{Name: "new-a", Kind: flov1.ProcessKind_PROCESS_KIND_ACTION},
		{Name: "new-b", Kind: flov1.ProcessKind_PROCESS_KIND_ACTION},
	}, getWorker(t, e.client, ns, "w").GetProcesses())

	list, err := e.client.ListWorkers(ctx, &flov1.ListWorkersRequest{Namespace: ns})
	require.NoError(t, err)
	require.Len(t, list.GetWorkers(), 1)

	e.events.waitEvents(t, ns, "w",
		change{evRegistered, stNone, stActive},
		change{evChanged, stActive, stDraining},
		change{evRegistered, stDraining, stActive},
	)
}

func testBadInput(t *testing.T, e *env) {
	ctx := t.Context()
	ns := namespace()
	action := flov1.WorkerType_WORKER_TYPE_ACTION
	tooMany := make([]*flov1.WorkerProcess, 257)
	for i := range tooMany {
		tooMany[i] = &flov1.WorkerProcess{Name: fmt.Sprintf("p%d", i)}
	}
	cases := []struct {
		name  string
		req   *flov1.RegisterWorkerRequest
		field string
	}{
		{"empty type", &flov1.RegisterWorkerRequest{WorkerId: "w"}, "worker_type is required"},
		{"unknown type", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: 99}, "worker_type"},
		{"malformed metadata", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action, Metadata: `{"a":`}, "metadata is not valid JSON"},
		{"metadata not an object", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action, Metadata: `[1, 2]`}, "metadata must be a JSON object"},
		{"metadata with NUL", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action, Metadata: `{"a":"\u0000"}`}, "metadata"},
		{"oversized metadata", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action, Metadata: `{"a":"` + strings.Repeat("x", 16<<10) + `"}`}, "metadata is 16392 bytes, at most 16384"},
		{"id starting with a dash", &flov1.RegisterWorkerRequest{WorkerId: "-w", WorkerType: action}, "worker_id"},
		{"id with a slash", &flov1.RegisterWorkerRequest{WorkerId: "a/b", WorkerType: action}, "worker_id"},
		{"id too long", &flov1.RegisterWorkerRequest{WorkerId: strings.Repeat("w", 129), WorkerType: action}, "worker_id"},
		{"negative concurrency", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action, MaxConcurrency: -1}, "max_concurrency"},
		{"concurrency too high", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action, MaxConcurrency: 10001}, "max_concurrency"},
		{"empty process name", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action, Processes: []*flov1.WorkerProcess{{Name: "a"}, {}}}, "processes[1].name is required"},
		{"process twice", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action, Processes: []*flov1.WorkerProcess{{Name: "a"}, {Name: "a"}}}, "processes[1].name"},
		{"unknown process kind", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action, Processes: []*flov1.WorkerProcess{{Name: "a", Kind: 7}}}, "processes[0].kind"},
		{"too many processes", &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action, Processes: tooMany}, "processes"},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Namespace = ns
			_, err := e.client.RegisterWorker(t.Context(), tt.req)
			requireCode(t, codes.InvalidArgument, err, tt.field)
		})
	}
	_, err := e.client.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{WorkerId: "w", WorkerType: action})
	requireCode(t, codes.InvalidArgument, err, "namespace is required")
	// Nothing was stored.
	list, err := e.client.ListWorkers(ctx, &flov1.ListWorkersRequest{Namespace: ns})
	require.NoError(t, err)
	require.Empty(t, list.GetWorkers())

	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "ok"})
	beats := []struct {
		name  string
		req   *flov1.HeartbeatRequest
		field string
	}{
		{"no id", &flov1.HeartbeatRequest{Namespace: ns}, "worker_id is required"},
		{"negative load", &flov1.HeartbeatRequest{Namespace: ns, WorkerId: "ok", CurrentLoad: -1}, "current_load"},
		{"negative cpu", &flov1.HeartbeatRequest{Namespace: ns, WorkerId: "ok", CpuLoad: -0.5}, "cpu_load"},
	}
	for _, tt := range beats {
		_, err := e.client.Heartbeat(ctx, tt.req)
		requireCode(t, codes.InvalidArgument, err, tt.field)
	}
	_, err = e.client.GetWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns})
	requireCode(t, codes.InvalidArgument, err, "worker_id is required")
	_, err = e.client.ListWorkers(ctx, &flov1.ListWorkersRequest{})
	requireCode(t, codes.InvalidArgument, err, "namespace is required")
	require.Equal(t, int32(0), getWorker(t, e.client, ns, "ok").GetCurrentLoad(), "refused heartbeats change nothing")
}

func testNamespaceLimit(t *testing.T, e *env) {
	ctx := t.Context()
	ns := namespace()
	const tries = 10
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		admitted  []string
		exhausted int
	)
	for i := range tries {
		wg.Go(func() {
			id := fmt.Sprintf("w%d", i)
			_, err := e.client.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: id, WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				admitted = append(admitted, id)
				return
			}
			requireCode(t, codes.ResourceExhausted, err, "namespace "+ns+" has 3 workers, the limit")
			exhausted++
		})
	}
	wg.Wait()
	require.Len(t, admitted, 3)
	require.Equal(t, tries-3, exhausted)
	list, err := e.client.ListWorkers(ctx, &flov1.ListWorkersRequest{Namespace: ns})
	require.NoError(t, err)
	require.Len(t, list.GetWorkers(), 3)

	// Re-registering a worker that is in is not a new worker.
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: admitted[0]})
	// An empty id is a new worker.
	_, err = e.client.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION})
	requireCode(t, codes.ResourceExhausted, err, "the limit")
	// Another namespace has its own limit.
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: namespace(), WorkerId: "w"})
	// Leaving makes room.
	_, err = e.client.DeregisterWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: admitted[1]})
	require.NoError(t, err)
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "late"})
}

func taskEvent(ns, worker, action string, typ eventsv1.TaskEventType) *eventsv1.TaskEvent {
	return &eventsv1.TaskEvent{
		EventId: uuid.NewString(), Type: typ, TaskId: uuid.NewString(), Namespace: ns,
		Action: action, WorkerId: worker, OccurredAt: timestamppb.Now(),
	}
}

// produceTaskEvents writes task events all keyed key, so they land on one
// partition in order.
func (e *env) produceTaskEvents(t *testing.T, key string, evs ...*eventsv1.TaskEvent) {
	t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i, ev := range evs {
		value, err := proto.Marshal(ev)
		require.NoError(t, err)
		recs[i] = &kgo.Record{Topic: kafka.TaskOutcomesTopic, Key: []byte(key), Value: value}
	}
	require.NoError(t, e.producer.ProduceSync(t.Context(), recs...).FirstErr())
}

func testCounters(t *testing.T, e *env) {
	ns := namespace()
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "w1", Processes: []*flov1.WorkerProcess{{Name: "send"}, {Name: "charge"}, {Name: "idle"}}})
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "w2", Processes: []*flov1.WorkerProcess{{Name: "send"}}})

	const (
		completed = eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED
		failed    = eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED
		retry     = eventsv1.TaskEventType_TASK_EVENT_TYPE_RETRY_SCHEDULED
		dead      = eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED
	)
	latest := time.Now().Add(time.Hour).Truncate(time.Microsecond).UTC()
	lastSend := taskEvent(ns, "w1", "send", completed)
	lastSend.OccurredAt = timestamppb.New(latest)
	batch := []*eventsv1.TaskEvent{
		taskEvent(ns, "w1", "send", completed),
		lastSend,
		taskEvent(ns, "w1", "send", completed),
		taskEvent(ns, "w1", "charge", failed),
		taskEvent(ns, "w1", "charge", retry),
		taskEvent(ns, "w1", "charge", dead),
		taskEvent(ns, "w1", "charge", completed),
		taskEvent(ns, "w1", "unlisted", completed),
		taskEvent(ns, "w2", "send", failed),
		// Not counted: types that say nothing about an attempt's end,
		// unknown workers, events without a worker.
		taskEvent(ns, "w1", "send", eventsv1.TaskEventType_TASK_EVENT_TYPE_CREATED),
		taskEvent(ns, "w1", "send", eventsv1.TaskEventType_TASK_EVENT_TYPE_STARTED),
		taskEvent(ns, "w1", "send", eventsv1.TaskEventType_TASK_EVENT_TYPE_LEASE_EXPIRED),
		taskEvent(ns, "w1", "send", eventsv1.TaskEventType_TASK_EVENT_TYPE_ABANDONED),
		taskEvent(ns, "w1", "send", eventsv1.TaskEventType_TASK_EVENT_TYPE_REQUEUED),
		taskEvent(ns, "ghost", "send", completed),
		taskEvent(ns, "", "send", failed),
		taskEvent(namespace(), "w1", "send", completed),
	}
	e.produceTaskEvents(t, "k1", batch...)
	// One more on another partition, so two handlers run.
	e.produceTaskEvents(t, "k2", taskEvent(ns, "w2", "send", completed))

	want := func(t *testing.T, w1Completed, w1Failed int64) {
		t.Helper()
		require.Eventually(t, func() bool {
			w1, w2 := getWorker(t, e.client, ns, "w1"), getWorker(t, e.client, ns, "w2")
			return w1.GetTasksCompleted() == w1Completed && w1.GetTasksFailed() == w1Failed &&
				w2.GetTasksCompleted() == 1 && w2.GetTasksFailed() == 1
		}, waitFor, tick, "counters never reached their totals: %v", getWorker(t, e.client, ns, "w1"))
	}
	want(t, 5, 3)
	w1 := getWorker(t, e.client, ns, "w1")
	byName := map[string]*flov1.WorkerProcess{}
	for _, p := range w1.GetProcesses() {
		byName[p.GetName()] = p
	}
	require.Len(t, byName, 4, "the unlisted action was added")
	require.Equal(t, [2]int64{3, 0}, [2]int64{byName["send"].GetRunCount(), byName["send"].GetFailCount()})
	require.Equal(t, latest, byName["send"].GetLastRunAt().AsTime(), "last_run_at is the latest event's time")
	require.Equal(t, [2]int64{1, 3}, [2]int64{byName["charge"].GetRunCount(), byName["charge"].GetFailCount()})
	require.Equal(t, [2]int64{1, 0}, [2]int64{byName["unlisted"].GetRunCount(), byName["unlisted"].GetFailCount()})
	require.Equal(t, flov1.ProcessKind_PROCESS_KIND_ACTION, byName["unlisted"].GetKind())
	require.Zero(t, byName["idle"].GetRunCount())
	require.Nil(t, byName["idle"].GetLastRunAt())

	// One more event on the same partition counts that one alone: the
	// partition's stored offset is past the batch. (Redeliveries are tested
	// in internal/tally.)
	e.produceTaskEvents(t, "k1", taskEvent(ns, "w1", "send", completed))
	want(t, 6, 3)
	require.Equal(t, int64(4), func() int64 {
		for _, p := range getWorker(t, e.client, ns, "w1").GetProcesses() {
			if p.GetName() == "send" {
				return p.GetRunCount()
			}
		}
		return -1
	}())
}

func testHTTP(t *testing.T, e *env) {
	get := func(path string) (int, string) { return harness.HTTPGet(t, "http://"+e.svc.HTTPAddr()+path) }
	code, _ := get("/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK }, waitFor, tick)
	code, body := get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "flo_test_metric")
}
