package devstack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/services/devstack"
)

// registerQuickStart registers the handlers of the quick-start worker in
// examples/quickstart, counting executions per task.
func registerQuickStart(runs *sync.Map) func(w *flo.ActionWorker) {
	count := func(id string) {
		n, _ := runs.LoadOrStore(id, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
	}
	return func(w *flo.ActionWorker) {
		w.MustRegisterAction("process-order", func(actx *flo.ActionContext) ([]byte, error) {
			count(actx.TaskID())
			var order map[string]interface{}
			actx.Into(&order)
			return actx.Bytes(map[string]string{"status": "done"})
		})
		w.MustRegisterAction("send-email", func(actx *flo.ActionContext) ([]byte, error) {
			count(actx.TaskID())
			return nil, nil
		})
	}
}

// invokeREST invokes an action through the REST facade and returns the task id.
func invokeREST(t *testing.T, httpAddr, ns, action string, input any) string {
	t.Helper()
	body, err := json.Marshal(map[string]any{"input": input})
	require.NoError(t, err)
	url := fmt.Sprintf("http://%s/v1/namespaces/%s/actions/%s/invoke", httpAddr, ns, action)
	resp, err := restCall(http.MethodPost, url, body)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var out struct {
		TaskID string `json:"taskId"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.NotEmpty(t, out.TaskID)
	return out.TaskID
}

func TestQuickStartWorkerCompletesTasksFromRESTAndSDK(t *testing.T) {
	e := newEnv(t)
	var runs sync.Map
	e.worker(t, "myapp", flo.ActionWorkerOptions{Concurrency: 10}, registerQuickStart(&runs))
	client := e.client(t, "myapp")
	ctx := context.Background()

	// The worker makes its actions known on connect; wait for that before invoking.
	require.Eventually(t, func() bool {
		_, err := client.GetAction(ctx, "send-email")
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)

	const perPath = 500
	ids := make([]string, 0, 2*perPath)
	for i := range perPath {
		ids = append(ids, invokeREST(t, e.stack.GatewayHTTPAddr(), "myapp", "process-order", map[string]any{"order_id": i}))
	}
	for i := range perPath {
		action := "process-order"
		if i%2 == 1 {
			action = "send-email"
		}
		id, err := client.Invoke(ctx, action, map[string]any{"order_id": i})
		require.NoError(t, err)
		ids = append(ids, id)
	}

	require.Eventually(t, func() bool {
		return e.countByState(t, "myapp")["completed"] == len(ids)
	}, 60*time.Second, 50*time.Millisecond, "states: %v", e.countByState(t, "myapp"))
	require.Equal(t, map[string]int{"completed": len(ids)}, e.countByState(t, "myapp"))

	for _, id := range ids {
		n, ok := runs.Load(id)
		require.True(t, ok, "task %s never ran", id)
		require.EqualValues(t, 1, n.(*atomic.Int32).Load(), "task %s ran more than once", id)
	}

	// The result is readable through the SDK and over REST.
	task, err := client.GetTask(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, flo.TaskCompleted, task.Status)
	require.JSONEq(t, `{"status":"done"}`, string(task.Result))

	resp, err := restCall(http.MethodGet, fmt.Sprintf("http://%s/v1/namespaces/myapp/tasks/%s", e.stack.GatewayHTTPAddr(), ids[1]), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var rest struct {
		Status string          `json:"status"`
		Output json.RawMessage `json:"output"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rest))
	require.Equal(t, "TASK_STATUS_COMPLETED", rest.Status)
	require.JSONEq(t, `{"status":"done"}`, string(rest.Output))
}

func TestFailingHandlerRetriesWithBackoffThenDeadLettersAndRequeues(t *testing.T) {
	e := newEnv(t)
	client := e.client(t, "default")
	ctx := context.Background()
	const delay = 150 * time.Millisecond
	_, err := client.RegisterAction(ctx, "flaky", flo.ActionOptions{
		Timeout:     10 * time.Second,
		MaxAttempts: 3,
		Backoff:     &flo.Backoff{Kind: flo.BackoffConstant, Initial: delay, Max: delay},
	})
	require.NoError(t, err)

	var (
		mu       sync.Mutex
		attempts []int
		times    []time.Time
		failing  atomic.Bool
	)
	failing.Store(true)
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 2}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("flaky", func(actx *flo.ActionContext) ([]byte, error) {
			mu.Lock()
			attempts = append(attempts, actx.Attempt())
			times = append(times, time.Now())
			mu.Unlock()
			if failing.Load() {
				return nil, errors.New("upstream unavailable")
			}
			return actx.Bytes(map[string]bool{"ok": true})
		})
	})

	id, err := client.Invoke(ctx, "flaky", map[string]int{"n": 1})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		state, _ := e.taskState(t, id)
		return state == "dead_lettered"
	}, 20*time.Second, 20*time.Millisecond)

	mu.Lock()
	require.Equal(t, []int{1, 2, 3}, attempts)
	for i := 1; i < len(times); i++ {
		require.GreaterOrEqual(t, times[i].Sub(times[i-1]), delay, "attempt %d came before the backoff", i+1)
	}
	mu.Unlock()

	task, err := client.GetTask(ctx, id)
	require.NoError(t, err)
	require.Equal(t, flo.TaskDeadLettered, task.Status)
	require.Equal(t, 3, task.Attempt)
	require.Contains(t, task.Error, "upstream unavailable")

	dead, err := client.ListDeadLetters(ctx, "flaky", 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, id, dead[0].ID)

	failing.Store(false)
	_, err = client.RequeueDeadLetter(ctx, id)
	require.NoError(t, err)
	task, err = client.AwaitTask(ctx, id, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, flo.TaskCompleted, task.Status)
	require.Equal(t, 1, task.Attempt)
	require.JSONEq(t, `{"ok":true}`, string(task.Result))

	dead, err = client.ListDeadLetters(ctx, "flaky", 10)
	require.NoError(t, err)
	require.Empty(t, dead)
}

func TestNonRetryableFailsOnceAndDeadLetterErrorDeadLetters(t *testing.T) {
	e := newEnv(t)
	client := e.client(t, "default")
	ctx := context.Background()
	for _, name := range []string{"validate-order", "charge"} {
		_, err := client.RegisterAction(ctx, name, flo.ActionOptions{MaxAttempts: 5})
		require.NoError(t, err)
	}
	var validateRuns, chargeRuns atomic.Int32
	e.worker(t, "default", flo.ActionWorkerOptions{}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("validate-order", func(actx *flo.ActionContext) (interface{}, error) {
			validateRuns.Add(1)
			return nil, flo.NewNonRetryableErrorf("missing orderId")
		})
		w.MustRegisterAction("charge", func(actx *flo.ActionContext) (interface{}, error) {
			chargeRuns.Add(1)
			return nil, flo.NewDeadLetterErrorf("card %s declined", "4242")
		})
	})

	validate, err := client.Invoke(ctx, "validate-order", map[string]string{})
	require.NoError(t, err)
	charge, err := client.Invoke(ctx, "charge", map[string]string{})
	require.NoError(t, err)

	task, err := client.AwaitTask(ctx, validate, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, flo.TaskFailed, task.Status)
	require.Equal(t, 1, task.Attempt)
	require.Contains(t, task.Error, "missing orderId")

	task, err = client.AwaitTask(ctx, charge, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, flo.TaskDeadLettered, task.Status)
	require.Equal(t, 1, task.Attempt)
	require.Contains(t, task.Error, "card 4242 declined")

	dead, err := client.ListDeadLetters(ctx, "", 10)
	require.NoError(t, err)
	require.Len(t, dead, 1, "only the explicit dead-letter failure is in the queue")
	require.Equal(t, charge, dead[0].ID)
	require.EqualValues(t, 1, validateRuns.Load())
	require.EqualValues(t, 1, chargeRuns.Load())
}

func TestKilledWorkerTaskIsRedeliveredAfterLeaseExpiry(t *testing.T) {
	e := newEnv(t)
	client := e.client(t, "default")
	ctx := context.Background()
	_, err := client.RegisterAction(ctx, "slow", flo.ActionOptions{Timeout: 500 * time.Millisecond, MaxAttempts: 3})
	require.NoError(t, err)

	// The first worker takes the task and goes silent: its connection is torn
	// down while the handler is still running, as when a process is killed.
	started := make(chan struct{})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	doomed := flo.NewClient(e.stack.GatewayGRPCAddr())
	require.NoError(t, doomed.Connect())
	w, err := doomed.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 1, ActionTimeout: time.Minute})
	require.NoError(t, err)
	var once sync.Once
	w.MustRegisterAction("slow", func(actx *flo.ActionContext) ([]byte, error) {
		once.Do(func() { close(started) })
		<-release
		return actx.Bytes("too late")
	})
	go w.Start(context.Background()) //nolint:errcheck // the worker is killed below; its error does not matter

	id, err := client.Invoke(ctx, "slow", nil)
	require.NoError(t, err)
	<-started
	require.NoError(t, doomed.Close())

	var rescuedAttempt atomic.Int32
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 1}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("slow", func(actx *flo.ActionContext) ([]byte, error) {
			rescuedAttempt.Store(int32(actx.Attempt()))
			return actx.Bytes("rescued")
		})
	})
	task, err := client.AwaitTask(ctx, id, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, flo.TaskCompleted, task.Status)
	require.Equal(t, 2, task.Attempt, "the expired lease counts an attempt")
	require.EqualValues(t, 2, rescuedAttempt.Load())
	require.JSONEq(t, `"rescued"`, string(task.Result))
}

func TestTouchKeepsLeaseAndAbandonDoesNotCountAnAttempt(t *testing.T) {
	e := newEnv(t)
	client := e.client(t, "default")
	ctx := context.Background()
	_, err := client.RegisterAction(ctx, "long", flo.ActionOptions{Timeout: 300 * time.Millisecond, MaxAttempts: 3})
	require.NoError(t, err)
	_, err = client.RegisterAction(ctx, "handoff", flo.ActionOptions{MaxAttempts: 3})
	require.NoError(t, err)

	var longRuns atomic.Int32
	var handoffAttempts []int
	var mu sync.Mutex
	register := func(w *flo.ActionWorker) {
		w.MustRegisterAction("long", func(actx *flo.ActionContext) ([]byte, error) {
			longRuns.Add(1)
			// Four times the lease, touching well inside it.
			for range 12 {
				time.Sleep(100 * time.Millisecond)
				if err := actx.Touch(300); err != nil {
					return nil, err
				}
			}
			return actx.Bytes("done")
		})
		w.MustRegisterAction("handoff", func(actx *flo.ActionContext) ([]byte, error) {
			mu.Lock()
			handoffAttempts = append(handoffAttempts, actx.Attempt())
			first := len(handoffAttempts) == 1
			mu.Unlock()
			if first {
				return nil, flo.ErrAbandon
			}
			return actx.Bytes("taken over")
		})
	}
	// Two workers, so a lost lease would show as a second run.
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 2}, register)
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 2}, register)

	long, err := client.Invoke(ctx, "long", nil)
	require.NoError(t, err)
	handoff, err := client.Invoke(ctx, "handoff", nil)
	require.NoError(t, err)

	task, err := client.AwaitTask(ctx, long, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, flo.TaskCompleted, task.Status)
	require.Equal(t, 1, task.Attempt)
	require.EqualValues(t, 1, longRuns.Load(), "the touched lease never expired")

	task, err = client.AwaitTask(ctx, handoff, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, flo.TaskCompleted, task.Status)
	require.Equal(t, 1, task.Attempt, "abandon returned the task without counting an attempt")
	mu.Lock()
	require.Equal(t, []int{1, 1}, handoffAttempts)
	mu.Unlock()
}

// The handler runs in the invoker's trace. While nothing records spans the
// hops between make none and pass the invoker's context on; with a span
// processor the handler has a span of its own.
func TestHandlerContinuesTheInvokersTrace(t *testing.T) {
	for _, recorded := range []bool{false, true} {
		t.Run(fmt.Sprintf("recorded=%v", recorded), func(t *testing.T) {
			var opts []devstack.Option
			if recorded {
				opts = append(opts, devstack.WithSpanProcessor(tracetest.NewSpanRecorder()))
			}
			handlerContinuesTheInvokersTrace(t, newEnvWith(t, nil, opts...), recorded)
		})
	}
}

func handlerContinuesTheInvokersTrace(t *testing.T, e *env, recorded bool) {
	client := e.client(t, "default")
	ctx := context.Background()
	_, err := client.RegisterAction(ctx, "traced", flo.ActionOptions{})
	require.NoError(t, err)
	seen := make(chan trace.SpanContext, 1)
	e.worker(t, "default", flo.ActionWorkerOptions{}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("traced", func(actx *flo.ActionContext) ([]byte, error) {
			seen <- trace.SpanContextFromContext(actx)
			return nil, nil
		})
	})

	// The invoker's span, as an instrumented caller would have it.
	traceID := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    traceID,
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	_, err = client.Invoke(trace.ContextWithSpanContext(ctx, parent), "traced", nil)
	require.NoError(t, err)

	select {
	case sc := <-seen:
		require.Equal(t, traceID, sc.TraceID(), "the handler runs in the invoker's trace")
		require.True(t, sc.IsSampled(), "the invoker's sampled flag reaches the handler")
		if recorded {
			require.NotEqual(t, parent.SpanID(), sc.SpanID(), "the handler has a span of its own")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("handler never ran")
	}
}
