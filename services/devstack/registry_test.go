package devstack_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/devstack"
)

// runningWorker is an ActionWorker whose Start result the test can read.
type runningWorker struct {
	w      *flo.ActionWorker
	client *flo.Client
	done   chan struct{} // closed when Start returned, with its result in err
	err    error
	cancel context.CancelFunc
}

// wait returns Start's result, or fails the test if Start does not return in time.
func (rw *runningWorker) wait(t *testing.T, why string) error {
	t.Helper()
	select {
	case <-rw.done:
		return rw.err
	case <-time.After(30 * time.Second):
		t.Fatal(why)
		return nil
	}
}

func (e *env) startWorker(t *testing.T, opts flo.ActionWorkerOptions, register func(w *flo.ActionWorker)) *runningWorker {
	t.Helper()
	c := flo.NewClient(e.stack.GatewayGRPCAddr())
	require.NoError(t, c.Connect())
	w, err := c.NewActionWorker(opts)
	require.NoError(t, err)
	register(w)
	ctx, cancel := context.WithCancel(context.Background())
	rw := &runningWorker{w: w, client: c, done: make(chan struct{}), cancel: cancel}
	go func() {
		rw.err = w.Start(ctx)
		close(rw.done)
	}()
	t.Cleanup(func() {
		cancel()
		rw.wait(t, "a worker did not stop")
		c.Close()
	})
	return rw
}

// workers lists the namespace's workers by id.
func workers(t *testing.T, c *flo.Client) map[string]*flo.Worker {
	t.Helper()
	list, err := c.ListWorkers(context.Background())
	require.NoError(t, err)
	out := map[string]*flo.Worker{}
	for _, w := range list {
		out[w.WorkerID] = w
	}
	return out
}

func newRegistryEnv(t *testing.T) *env {
	return newEnvWith(t, func(cfg *devstack.Config) {
		cfg.HeartbeatTimeout = 600 * time.Millisecond
		cfg.HealthCheckInterval = 50 * time.Millisecond
	})
}

func TestWorkerLifecycleListDrainAndHealth(t *testing.T) {
	e := newRegistryEnv(t)
	client := e.client(t, "default")
	ctx := context.Background()
	_, err := client.RegisterAction(ctx, "job", flo.ActionOptions{})
	require.NoError(t, err)
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	var ranOnA atomic.Int32
	opts := func(id string) flo.ActionWorkerOptions {
		return flo.ActionWorkerOptions{
			WorkerID: id, MachineID: "laptop-1", Concurrency: 4,
			HeartbeatInterval: 100 * time.Millisecond,
			Metadata:          map[string]any{"version": "1.2.3"},
			ActionTimeout:     10 * time.Second,
		}
	}
	a := e.startWorker(t, opts("worker-a"), func(w *flo.ActionWorker) {
		w.MustRegisterAction("job", func(actx *flo.ActionContext) ([]byte, error) {
			ranOnA.Add(1)
			<-release
			return actx.Bytes("a")
		})
	})
	// A is alone when the task it will hold arrives.
	held, err := client.Invoke(ctx, "job", nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return ranOnA.Load() == 1 }, 10*time.Second, 10*time.Millisecond,
		"the held task did not land on A")
	e.startWorker(t, opts("worker-b"), func(w *flo.ActionWorker) {
		w.MustRegisterAction("job", func(actx *flo.ActionContext) ([]byte, error) { return actx.Bytes("b") })
	})
	c := e.startWorker(t, opts("worker-c"), func(w *flo.ActionWorker) {
		w.MustRegisterAction("job", func(actx *flo.ActionContext) ([]byte, error) { return actx.Bytes("c") })
	})

	require.Eventually(t, func() bool { return len(workers(t, client)) == 3 }, 10*time.Second, 20*time.Millisecond)
	ws := workers(t, client)
	for _, id := range []string{"worker-a", "worker-b", "worker-c"} {
		w := ws[id]
		require.NotNil(t, w, id)
		require.Equal(t, flo.WorkerTypeAction, w.WorkerType)
		require.Contains(t, []flo.WorkerStatus{flo.WorkerActive, flo.WorkerIdle}, w.Status)
		require.Equal(t, 4, w.MaxConcurrency)
		require.Equal(t, "laptop-1", w.MachineID)
		require.JSONEq(t, `{"version":"1.2.3"}`, string(w.Metadata))
		require.Len(t, w.Processes, 1)
		require.Equal(t, "job", w.Processes[0].Name)
	}

	// A holds a task when it is drained: it finishes it, gets nothing new,
	// deregisters and Start returns.
	drained, err := client.DrainWorker(ctx, "worker-a")
	require.NoError(t, err)
	require.Equal(t, flo.WorkerDraining, drained.Status)
	require.Eventually(t, func() bool {
		w := workers(t, client)["worker-a"]
		return w != nil && w.Status == flo.WorkerDraining
	}, 5*time.Second, 20*time.Millisecond)
	for range 20 {
		_, err := client.Invoke(ctx, "job", nil)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		return e.countByState(t, "default")["completed"] == 20
	}, 20*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 1, ranOnA.Load(), "a draining worker got a new task")
	select {
	case <-a.done:
		t.Fatalf("Start returned before the held task finished: %v", a.err)
	default:
	}
	releaseOnce.Do(func() { close(release) })
	require.NoError(t, a.wait(t, "Start did not return after the drain"))
	task, err := client.AwaitTask(ctx, held, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, flo.TaskCompleted, task.Status)
	require.Eventually(t, func() bool {
		_, ok := workers(t, client)["worker-a"]
		return !ok
	}, 10*time.Second, 20*time.Millisecond, "the drained worker did not deregister")

	// C goes silent (its process dies: the connection is torn down and no
	// heartbeat comes), turns unhealthy after the timeout and stays listed.
	c.cancel()
	require.NoError(t, c.client.Close())
	rawC := flov1.NewWorkerRegistryServiceClient(dial(t, e.stack.GatewayGRPCAddr()))
	require.Eventually(t, func() bool {
		w := workers(t, client)["worker-c"]
		return w != nil && w.Status == flo.WorkerUnhealthy
	}, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, []flo.WorkerStatus{flo.WorkerActive, flo.WorkerIdle}, workers(t, client)["worker-b"].Status,
		"a heartbeating worker stays healthy")

	// A heartbeat brings it back.
	resp, err := rawC.Heartbeat(ctx, &flov1.HeartbeatRequest{Namespace: "default", WorkerId: "worker-c", CurrentLoad: 1})
	require.NoError(t, err)
	require.Equal(t, flov1.WorkerStatus_WORKER_STATUS_ACTIVE, resp.GetStatus())
	require.Equal(t, flo.WorkerActive, workers(t, client)["worker-c"].Status)
}

func TestDrainUnderLoadLosesNothing(t *testing.T) {
	e := newRegistryEnv(t)
	client := e.client(t, "default")
	ctx := context.Background()
	_, err := client.RegisterAction(ctx, "step", flo.ActionOptions{Timeout: 5 * time.Second})
	require.NoError(t, err)
	var runs sync.Map
	var drainedRuns, otherRuns atomic.Int32
	handler := func(mine *atomic.Int32) func(w *flo.ActionWorker) {
		return func(w *flo.ActionWorker) {
			w.MustRegisterAction("step", func(actx *flo.ActionContext) ([]byte, error) {
				n, _ := runs.LoadOrStore(actx.TaskID(), new(atomic.Int32))
				n.(*atomic.Int32).Add(1)
				mine.Add(1)
				time.Sleep(2 * time.Millisecond)
				return nil, nil
			})
		}
	}
	opts := flo.ActionWorkerOptions{Concurrency: 16, HeartbeatInterval: 100 * time.Millisecond}
	drained := e.startWorker(t, opts, handler(&drainedRuns))
	e.startWorker(t, opts, handler(&otherRuns))

	payloads := make([]any, 1000)
	for i := range payloads {
		payloads[i] = map[string]int{"i": i}
	}
	ids, err := client.InvokeMany(ctx, "step", payloads[:500])
	require.NoError(t, err)
	// Drain while the worker is busy.
	require.Eventually(t, func() bool { return drainedRuns.Load() >= 20 }, 20*time.Second, time.Millisecond)
	_, err = client.DrainWorker(ctx, drained.w.ID())
	require.NoError(t, err)
	more, err := client.InvokeMany(ctx, "step", payloads[500:])
	require.NoError(t, err)
	ids = append(ids, more...)

	require.NoError(t, drained.wait(t, "the drained worker's Start did not return"))
	require.Eventually(t, func() bool {
		return e.countByState(t, "default")["completed"] == len(ids)
	}, 60*time.Second, 50*time.Millisecond, "states: %v", e.countByState(t, "default"))
	for _, id := range ids {
		n, ok := runs.Load(id)
		require.True(t, ok, "task %s never ran", id)
		require.EqualValues(t, 1, n.(*atomic.Int32).Load(), "task %s ran twice", id)
	}
	_, listed := workers(t, client)[drained.w.ID()]
	require.False(t, listed, "the drained worker deregistered")
	require.Positive(t, otherRuns.Load())
}

func TestRegistryRestartKeepsRecordsAndHeartbeats(t *testing.T) {
	e := newRegistryEnv(t)
	client := e.client(t, "default")
	rw := e.startWorker(t, flo.ActionWorkerOptions{HeartbeatInterval: 50 * time.Millisecond}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("noop", func(actx *flo.ActionContext) ([]byte, error) { return nil, nil })
	})
	id := rw.w.ID()
	require.Eventually(t, func() bool { return workers(t, client)[id] != nil }, 10*time.Second, 20*time.Millisecond)
	before := workers(t, client)[id]

	require.NoError(t, e.stack.StopRegistry())
	require.NoError(t, e.stack.StartRegistry(context.Background()))

	require.Eventually(t, func() bool {
		// The gateway's connection to the registry may still be backing
		// off right after the restart; only a listed record counts.
		list, err := client.ListWorkers(context.Background())
		if err != nil {
			return false
		}
		var w *flo.Worker
		for _, lw := range list {
			if lw.WorkerID == id {
				w = lw
			}
		}
		return w != nil && w.LastHeartbeat.After(before.LastHeartbeat) &&
			(w.Status == flo.WorkerActive || w.Status == flo.WorkerIdle)
	}, 10*time.Second, 20*time.Millisecond, "heartbeats resumed against the restarted registry")
	require.Equal(t, before.RegisteredAt, workers(t, client)[id].RegisteredAt, "the record survived, not re-created")
	select {
	case <-rw.done:
		t.Fatalf("the worker stopped: %v", rw.err)
	default:
	}
}

func TestCountersMatchWhatEachWorkerDid(t *testing.T) {
	e := newRegistryEnv(t)
	client := e.client(t, "default")
	ctx := context.Background()
	_, err := client.RegisterAction(ctx, "score", flo.ActionOptions{MaxAttempts: 1})
	require.NoError(t, err)
	type tally struct{ completed, failed atomic.Int64 }
	counts := map[string]*tally{}
	var mu sync.Mutex
	handler := func(id string) func(w *flo.ActionWorker) {
		mu.Lock()
		counts[id] = &tally{}
		mu.Unlock()
		return func(w *flo.ActionWorker) {
			w.MustRegisterAction("score", func(actx *flo.ActionContext) ([]byte, error) {
				var p struct{ I int }
				if err := json.Unmarshal(actx.Payload(), &p); err != nil {
					return nil, err
				}
				if p.I%3 == 0 {
					counts[id].failed.Add(1)
					return nil, flo.NewNonRetryableErrorf("multiple of three")
				}
				counts[id].completed.Add(1)
				return nil, nil
			})
		}
	}
	e.startWorker(t, flo.ActionWorkerOptions{WorkerID: "w1", Concurrency: 3}, handler("w1"))
	e.startWorker(t, flo.ActionWorkerOptions{WorkerID: "w2", Concurrency: 3}, handler("w2"))

	payloads := make([]any, 300)
	for i := range payloads {
		payloads[i] = map[string]int{"I": i}
	}
	_, err = client.InvokeMany(ctx, "score", payloads)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s := e.countByState(t, "default")
		return s["completed"]+s["failed"] == len(payloads)
	}, 30*time.Second, 20*time.Millisecond)

	require.Eventually(t, func() bool {
		ws := workers(t, client)
		for id, c := range counts {
			w := ws[id]
			if w == nil || w.TasksCompleted != c.completed.Load() || w.TasksFailed != c.failed.Load() {
				return false
			}
			if len(w.Processes) != 1 || w.Processes[0].RunCount != c.completed.Load() || w.Processes[0].FailCount != c.failed.Load() {
				return false
			}
		}
		return true
	}, 20*time.Second, 50*time.Millisecond, "registry counters never matched the workers' own counts")
	require.Equal(t, int64(100), counts["w1"].failed.Load()+counts["w2"].failed.Load())
}
