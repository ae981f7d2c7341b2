package service_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/localbroker"
	"github.com/razorbill/flo/libs/telemetry/telemetrytest"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/dispatcher/service"
)

// payloadBytes reads flo.dispatcher.payload_bytes of every partition.
func payloadBytes(m *telemetrytest.Reader) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m.Series() {
		if attrs, ok := strings.CutPrefix(k, "flo.dispatcher.payload_bytes "); ok {
			out[attrs] = v
		}
	}
	return out
}

// A backlog far beyond the payload bound: each partition keeps no more
// than the bound of payloads in memory once the view has them, and every
// task still reaches its handler with its exact payload, read from the view
// at claim.
func TestPayloadMemoryIsBounded(t *testing.T) {
	// Not parallel: the gauge is read through the global meter provider.
	metrics := telemetrytest.Global(t)
	const (
		bound = 16 << 10 // per partition
		tasks = 2000
	)
	broker := harness.NewBroker(t)
	cfg := boundedConfig(t, broker)
	cfg.PayloadMemory, cfg.HotHorizon = bound, time.Minute
	e, ns, _ := startBounded(t, cfg, broker)

	cmds := make([]*eventsv1.InvokeTask, tasks)
	want := map[string][]byte{}
	last := map[int32]string{}
	for i := range cmds {
		cmds[i] = &eventsv1.InvokeTask{Namespace: ns, Action: "work", Payload: fmt.Appendf(nil, "%-1024d", i)}
	}
	e.produce(t, "", nil, cmds...)
	for _, c := range cmds {
		want[c.GetTaskId()] = c.GetPayload()
		last[kafka.PartitionOf(c.GetTaskId(), partitions)] = c.GetTaskId()
	}
	// The last invocation of each partition applied, all are.
	for _, id := range last {
		e.waitTask(t, ns, id)
	}
	var held map[string]float64
	require.Eventually(t, func() bool {
		held = payloadBytes(metrics)
		for _, v := range held {
			if v > bound {
				return false
			}
		}
		return len(held) == partitions
	}, waitFor, tick)
	t.Logf("payload bytes held: %v", held)
	// A read of a task whose payload went has it.
	for _, id := range last {
		require.Equal(t, want[id], e.task(t, ns, id).GetPayload())
	}

	// Dead letters whose payloads went are requeued with them: the
	// REQUEUED record carries the payload, and the next claim gets it.
	first := e.claim(t, ns, []string{"work"}, 100, waitFor, time.Minute)
	require.NotEmpty(t, first)
	fails := make([]*dispatcherv1.Report, len(first))
	for i, a := range first {
		require.True(t, bytes.Equal(want[a.GetTaskId()], a.GetPayload()), "payload of %s", a.GetTaskId())
		fails[i] = failed(a, "boom", false, false)
	}
	require.Empty(t, e.report(t, ns, fails...))
	for _, a := range first {
		task, err := e.client.RequeueDeadLetter(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: a.GetTaskId()})
		require.NoError(t, err)
		require.Equal(t, want[a.GetTaskId()], task.GetPayload())
	}

	got := 0
	for got < tasks {
		batch := e.claim(t, ns, []string{"work"}, 100, waitFor, time.Minute)
		require.NotEmpty(t, batch)
		reports := make([]*dispatcherv1.Report, len(batch))
		for i, a := range batch {
			p, ok := want[a.GetTaskId()]
			require.True(t, ok, "task %s claimed twice or unknown", a.GetTaskId())
			require.True(t, bytes.Equal(p, a.GetPayload()), "payload of %s", a.GetTaskId())
			delete(want, a.GetTaskId())
			reports[i] = completed(a, `{}`, "")
		}
		require.Empty(t, e.report(t, ns, reports...))
		got += len(batch)
	}
	require.Empty(t, want)
	require.Eventually(t, func() bool {
		held = payloadBytes(metrics)
		for _, v := range held {
			if v != 0 {
				return false
			}
		}
		return true
	}, waitFor, tick, "finished tasks let their payloads go")
}

// boundedConfig is a dispatcher's configuration for the memory tests, on a
// database of its own and broker.
func boundedConfig(t *testing.T, broker *localbroker.Broker) service.Config {
	t.Helper()
	return service.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BootstrapNamespaces: []string{"default"},
		Postgres: config.Postgres{URL: harness.NewDatabase(t), MaxConns: 8},
		Kafka:    config.Kafka{Brokers: broker.Addrs(), Partitions: partitions},
		Auth:     harness.InternalAuth(),
	}
}

// startBounded runs a dispatcher with cfg on broker and returns an env of
// it, a namespace with the action "work" (one attempt), and stop.
func startBounded(t *testing.T, cfg service.Config, broker *localbroker.Broker) (e *env, ns string, stop func()) {
	t.Helper()
	svc, stop := startService(t, cfg)
	e = &env{svc: svc, client: dispatcherv1.NewDispatcherClient(harness.DialInternal(t, svc.GRPCAddr())), producer: newProducer(t, broker.Addrs())}
	ns = e.namespace(t)
	e.register(t, ns, "work", &flov1.RegisterActionRequest{MaxAttempts: 1})
	return e, ns, stop
}

// startQueueBounded starts a dispatcher that holds bound queued tasks per
// partition, with the config it ran with.
func startQueueBounded(t *testing.T, bound int) (e *env, ns string, cfg service.Config, stop func()) {
	t.Helper()
	broker := harness.NewBroker(t)
	cfg = boundedConfig(t, broker)
	cfg.QueuedTasks = bound
	e, ns, stop = startBounded(t, cfg, broker)
	return e, ns, cfg, stop
}

// startService runs a dispatcher until the test ends, or stop.
func startService(t *testing.T, cfg service.Config) (svc *service.Service, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := service.New(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return svc, stop
}

// queuedTasks reads flo.dispatcher.queued_tasks: the queued tasks each
// partition holds (held) and keeps only in the view (cold), summed.
func queuedTasks(m *telemetrytest.Reader) (held map[string]float64, cold float64) {
	held = map[string]float64{}
	for k, v := range m.Series() {
		attrs, ok := strings.CutPrefix(k, "flo.dispatcher.queued_tasks ")
		switch {
		case !ok:
		case strings.Contains(attrs, "held=true"):
			held[attrs] = v
		default:
			cold += v
		}
	}
	return held, cold
}

// A backlog far beyond the bound of queued tasks held: each partition holds
// no more than the bound (and a tenth), the rest wait in the view with their
// places in the queue, a read finds them whole, a restarted replica rebuilds
// within the bound too, and every task is handed out once, with its
// payload, the highest priorities first.
func TestQueuedTasksPastTheBoundWaitInTheView(t *testing.T) {
	// Not parallel: the gauge is read through the global meter provider.
	metrics := telemetrytest.Global(t)
	const (
		bound = 40 // per partition
		tasks = 1000
	)
	e, ns, cfg, stop := startQueueBounded(t, bound)

	cmds := make([]*eventsv1.InvokeTask, tasks)
	want := map[string][]byte{}
	prio := map[string]int32{}
	last := map[int32]string{}
	for i := range cmds {
		cmds[i] = &eventsv1.InvokeTask{Namespace: ns, Action: "work", Payload: fmt.Appendf(nil, `"%d"`, i), Priority: int32(i % 3)}
	}
	e.produce(t, "", nil, cmds...)
	for _, c := range cmds {
		want[c.GetTaskId()] = c.GetPayload()
		prio[c.GetTaskId()] = c.GetPriority()
		last[kafka.PartitionOf(c.GetTaskId(), partitions)] = c.GetTaskId()
	}
	for _, id := range last {
		e.waitTask(t, ns, id)
	}
	var (
		held map[string]float64
		cold float64
	)
	bounded := func() {
		t.Helper()
		require.Eventually(t, func() bool {
			held, cold = queuedTasks(metrics)
			for _, v := range held {
				if v > bound+bound/10 {
					return false
				}
			}
			return len(held) == partitions && cold >= tasks-partitions*(bound+bound/10)
		}, waitFor, tick, "held %v, cold %v", &held, &cold)
		t.Logf("queued tasks held: %v, cold: %v", held, cold)
	}
	bounded()
	// A read finds a cold task whole, and so do they all.
	for id, payload := range want {
		task := e.task(t, ns, id)
		require.Equal(t, payload, task.GetPayload())
		require.Equal(t, flov1.TaskStatus_TASK_STATUS_QUEUED, task.GetStatus())
	}

	// Requeuing a cold task is refused as for any queued one.
	var lowest string
	for id, p := range prio {
		if p == 0 {
			lowest = id
			break
		}
	}
	_, err := e.client.RequeueDeadLetter(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: lowest})
	requireCode(t, codes.FailedPrecondition, err, "not dead-lettered")

	// A new owner reads the first in hand-out order whole, the rest cold.
	stop()
	svc, _ := startService(t, cfg)
	e.svc, e.client = svc, dispatcherv1.NewDispatcherClient(harness.DialInternal(t, svc.GRPCAddr()))
	bounded()
	// Invoking tasks again, cold ones among them, changes none of them:
	// the claims below take each once, with its first payload.
	again := make([]*eventsv1.InvokeTask, 100)
	for i, c := range cmds[:len(again)] {
		again[i] = proto.CloneOf(c)
		again[i].Payload = []byte(`"again"`)
	}
	e.produce(t, "", nil, again...)
	// A task invoked after them in each partition shows they were taken in.
	markers := map[int32]*eventsv1.InvokeTask{}
	for len(markers) < partitions {
		c := &eventsv1.InvokeTask{TaskId: uuid.NewString(), Namespace: ns, Action: "work", Payload: []byte(`"marker"`)}
		markers[kafka.PartitionOf(c.TaskId, partitions)] = c
	}
	for _, c := range markers {
		e.produce(t, "", nil, c)
		want[c.TaskId], prio[c.TaskId] = c.Payload, 0
	}
	for _, c := range markers {
		e.waitTask(t, ns, c.TaskId)
	}

	first := true
	for len(want) > 0 {
		batch := e.claim(t, ns, []string{"work"}, 100, waitFor, time.Minute)
		require.NotEmpty(t, batch, "%d tasks never handed out", len(want))
		reports := make([]*dispatcherv1.Report, len(batch))
		for i, a := range batch {
			p, ok := want[a.GetTaskId()]
			require.True(t, ok, "task %s claimed twice or unknown", a.GetTaskId())
			require.True(t, bytes.Equal(p, a.GetPayload()), "payload of %s", a.GetTaskId())
			if first {
				require.Equal(t, int32(2), prio[a.GetTaskId()], "the highest priority first")
			}
			delete(want, a.GetTaskId())
			reports[i] = completed(a, `{}`, "")
		}
		require.Empty(t, e.report(t, ns, reports...))
		first = false
	}
	require.Eventually(t, func() bool {
		held, cold = queuedTasks(metrics)
		for _, v := range held {
			if v != 0 {
				return false
			}
		}
		return cold == 0
	}, waitFor, tick, "nothing left held or cold")
}

// An action nobody works (its workers are down) may fill every partition
// past the bound; another action's tasks are still handed out, all of them,
// while the first action's wait in the view.
func TestAnActionWithoutWorkersKeepsNoOtherInTheView(t *testing.T) {
	// Not parallel: the gauge is read through the global meter provider.
	metrics := telemetrytest.Global(t)
	const (
		bound = 40 // per partition
		stuck = 1000
		work  = 200
	)
	e, ns, _, _ := startQueueBounded(t, bound)
	e.register(t, ns, "stuck", &flov1.RegisterActionRequest{MaxAttempts: 1})

	// settled waits until every partition holds the bound and a tenth at
	// most, and the view has the rest.
	settled := func(all int) {
		t.Helper()
		var (
			held map[string]float64
			cold float64
		)
		require.Eventually(t, func() bool {
			held, cold = queuedTasks(metrics)
			sum := cold
			for _, v := range held {
				if v > bound+bound/10 {
					return false
				}
				sum += v
			}
			return len(held) == partitions && cold > 0 && int(sum) == all
		}, waitFor, tick, "held %v, cold %v", &held, &cold)
	}
	invoke := func(action string, n int) map[string]bool {
		cmds := make([]*eventsv1.InvokeTask, n)
		for i := range cmds {
			cmds[i] = &eventsv1.InvokeTask{Namespace: ns, Action: action, Payload: fmt.Appendf(nil, `"%d"`, i)}
		}
		e.produce(t, "", nil, cmds...)
		ids := map[string]bool{}
		for _, c := range cmds {
			ids[c.GetTaskId()] = true
		}
		return ids
	}
	invoke("stuck", stuck)
	settled(stuck)
	want := invoke("work", work)
	settled(stuck + work)

	e.completeAll(t, ns, want)
	settled(stuck)
}

// Delayed tasks past the bound, left in the view by a new owner, go out once
// due, while their action's backlog arrives as fast as it is worked: the
// action never runs low and no partition drains to half the bound, which
// were the only ways they came back before. They have the highest priority,
// so they go out first once due; never before.
func TestDelayedTasksPastTheBoundGoOutOnceDue(t *testing.T) {
	// Not parallel: the gauge is read through the global meter provider.
	metrics := telemetrytest.Global(t)
	const (
		bound   = 40 // per partition
		backlog = 800
		delayed = 12
	)
	e, ns, cfg, stop := startQueueBounded(t, bound)
	invoke := func(n int, priority int32, runAt time.Time) []string {
		cmds := make([]*eventsv1.InvokeTask, n)
		ids := make([]string, n)
		for i := range cmds {
			cmds[i] = &eventsv1.InvokeTask{TaskId: uuid.NewString(), Namespace: ns, Action: "work", Payload: []byte(`{}`), Priority: priority}
			if !runAt.IsZero() {
				cmds[i].RunAt = timestamppb.New(runAt)
			}
			ids[i] = cmds[i].TaskId
		}
		e.produce(t, "", nil, cmds...)
		return ids
	}
	// The delayed ones first, so each partition lets them go cold first.
	due := time.Now().Add(5 * time.Second)
	late := invoke(delayed, 5, due)
	invoke(backlog, 0, time.Time{})
	var (
		held map[string]float64
		cold float64
	)
	require.Eventually(t, func() bool {
		held, cold = queuedTasks(metrics)
		for _, v := range held {
			if v > bound+bound/10 {
				return false
			}
		}
		return len(held) == partitions && cold >= delayed+backlog-partitions*(bound+bound/10)
	}, waitFor, tick, "held %v, cold %v", &held, &cold)

	// A new owner reads the first ready tasks in hand-out order and leaves
	// the delayed ones in the view, with when they come due.
	stop()
	svc, _ := startService(t, cfg)
	e.svc, e.client = svc, dispatcherv1.NewDispatcherClient(harness.DialInternal(t, svc.GRPCAddr()))

	want := map[string]bool{}
	for _, id := range late {
		want[id] = true
	}
	deadline := due.Add(waitFor)
	for len(want) > 0 {
		require.True(t, time.Now().Before(deadline), "%d delayed tasks never went out", len(want))
		invoke(8, 0, time.Time{})
		batch := e.claim(t, ns, []string{"work"}, 8, waitFor, time.Minute)
		reports := make([]*dispatcherv1.Report, len(batch))
		for i, a := range batch {
			if want[a.GetTaskId()] {
				require.False(t, time.Now().Before(due), "a delayed task went out before it was due")
				delete(want, a.GetTaskId())
			}
			reports[i] = completed(a, `{}`, "")
		}
		require.Empty(t, e.report(t, ns, reports...))
	}
}

// A new owner's snapshot of the view may hold final rows ahead of its
// offsets: the view writes a final state at once, while a live state of
// another task holds the partition's offsets back (a crash or a move then
// leaves them so). The replay takes those tasks in again, as it does cold
// ones; only the cold ones may come off their queues' counts, or tasks
// stay in the view that no read ever brings back.
func TestARebuildCountsOnlyColdTasksItTakesBackIn(t *testing.T) {
	// Not parallel: the service's gauges go to the global meter provider,
	// which other tests here read.
	const (
		bound = 4 // per partition
		tasks = 15
		done  = bound
	)
	e, ns, cfg, stop := startQueueBounded(t, bound)
	db, err := pgx.Connect(t.Context(), cfg.Postgres.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close(context.WithoutCancel(t.Context())) })

	// All in one partition, so the counts below are the partition's.
	cmds := make([]*eventsv1.InvokeTask, 0, tasks)
	for len(cmds) < tasks {
		if id := uuid.NewString(); kafka.PartitionOf(id, partitions) == 0 {
			cmds = append(cmds, &eventsv1.InvokeTask{TaskId: id, Namespace: ns, Action: "work", Payload: []byte(`{}`)})
		}
	}
	e.produce(t, "", nil, cmds...)
	e.waitTask(t, ns, cmds[len(cmds)-1].TaskId)
	var first []*flov1.TaskAssignment
	for len(first) < done {
		batch := e.claim(t, ns, []string{"work"}, int32(done-len(first)), waitFor, time.Minute)
		require.NotEmpty(t, batch)
		first = append(first, batch...)
	}
	reports := make([]*dispatcherv1.Report, len(first))
	for i, a := range first {
		reports[i] = completed(a, `{}`, "")
	}
	require.Empty(t, e.report(t, ns, reports...))
	stop()

	// The view as a held live state leaves it: each partition's offsets
	// before its first completion, the completed rows written.
	tag, err := db.Exec(t.Context(), `UPDATE dispatcher.view_offsets v SET events_offset = c.first
	FROM (SELECT partition, min(view_offset) AS first FROM dispatcher.tasks WHERE state = 'completed' GROUP BY partition) c
	WHERE v.partition = c.partition`)
	require.NoError(t, err)
	require.Positive(t, tag.RowsAffected())

	svc, _ := startService(t, cfg)
	e.svc, e.client = svc, dispatcherv1.NewDispatcherClient(harness.DialInternal(t, svc.GRPCAddr()))
	want := map[string]bool{}
	for _, c := range cmds {
		want[c.TaskId] = true
	}
	for _, a := range first {
		delete(want, a.GetTaskId())
	}
	e.completeAll(t, ns, want)
}

// completeAll claims tasks of the action "work" and completes them until
// every task of want went out, once each; it empties want.
func (e *env) completeAll(t *testing.T, ns string, want map[string]bool) {
	t.Helper()
	for len(want) > 0 {
		batch := e.claim(t, ns, []string{"work"}, 50, waitFor, time.Minute)
		require.NotEmpty(t, batch, "%d tasks of work never handed out", len(want))
		reports := make([]*dispatcherv1.Report, len(batch))
		for i, a := range batch {
			require.True(t, want[a.GetTaskId()], "task %s claimed twice or unknown", a.GetTaskId())
			delete(want, a.GetTaskId())
			reports[i] = completed(a, `{}`, "")
		}
		require.Empty(t, e.report(t, ns, reports...))
	}
}
