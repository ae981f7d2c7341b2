package devstack_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
)

// pendingTask is what an async handler hands its "webhook": the task and the
// token that finishes it.
type pendingTask struct{ id, token string }

// asyncStack starts a platform, registers action with maxAttempts, and
// starts a worker with one slot whose handler for it hands its task to the
// returned channel and answers that the result comes later, within the
// payload's wait_ms (zero: the default).
func asyncStack(t *testing.T, action string, maxAttempts int) (*env, *flo.Client, <-chan pendingTask) {
	t.Helper()
	e := newEnv(t)
	c := e.client(t, "default")
	_, err := c.RegisterAction(context.Background(), action, flo.ActionOptions{MaxAttempts: maxAttempts})
	require.NoError(t, err)
	handed := make(chan pendingTask, 8)
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 1}, func(w *flo.ActionWorker) {
		w.MustRegisterAction(action, func(actx *flo.ActionContext) ([]byte, error) {
			var in struct {
				WaitMS int64 `json:"wait_ms"`
			}
			if err := actx.Into(&in); err != nil {
				return nil, err
			}
			handed <- pendingTask{id: actx.TaskID(), token: actx.CompletionToken()}
			return nil, flo.ResultPendingWithin(time.Duration(in.WaitMS) * time.Millisecond)
		})
	})
	waitActions(t, c, action)
	return e, c, handed
}

// TestAsyncCompletionByToken: a handler returning ErrResultPending frees its
// worker's only slot at once (the second task reaches the handler while the
// first waits), and a "webhook" finishes each task by token: the first over
// REST, exactly once, the second over gRPC with a final, coded failure.
func TestAsyncCompletionByToken(t *testing.T) {
	e, c, handed := asyncStack(t, "charge", 3)
	ctx := context.Background()

	first, err := c.Invoke(ctx, "charge", map[string]any{})
	require.NoError(t, err)
	second, err := c.Invoke(ctx, "charge", map[string]any{})
	require.NoError(t, err)
	tasks := map[string]pendingTask{}
	for range 2 {
		p := <-handed
		tasks[p.id] = p
	}
	require.Contains(t, tasks, first)
	require.Contains(t, tasks, second)
	require.Eventually(t, func() bool {
		task, err := c.GetTask(ctx, first)
		return err == nil && task.Status == flo.TaskWaiting
	}, runWait, 10*time.Millisecond)
	waiting, err := c.GetTask(ctx, first)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(24*time.Hour), waiting.CompleteBy, time.Minute)

	// The webhook completes the first over REST.
	type answer struct {
		code int
		body map[string]any
	}
	webhook := make(chan answer, 1)
	go func() {
		code, body := postJSONAsync("http://"+e.stack.GatewayHTTPAddr()+"/v1/namespaces/default/tasks:complete",
			map[string]any{"token": tasks[first].token, "output": map[string]any{"paid": true}})
		webhook <- answer{code, body}
	}()
	got := <-webhook
	require.Equal(t, http.StatusOK, got.code, "%v", got.body)
	require.Equal(t, "TASK_STATUS_COMPLETED", got.body["status"])
	done, err := c.AwaitTask(ctx, first, runWait)
	require.NoError(t, err)
	require.Equal(t, flo.TaskCompleted, done.Status)
	require.JSONEq(t, `{"paid":true}`, string(done.Result))
	require.Equal(t, 1, done.Attempt)
	// Exactly once.
	code, body := postJSON(t, e, "/v1/namespaces/default/tasks:complete", map[string]any{"token": tasks[first].token})
	require.Equal(t, http.StatusBadRequest, code, "%v", body)
	require.Contains(t, body["message"], "not waiting for a result")
	code, body = postJSON(t, e, "/v1/namespaces/default/tasks:fail", map[string]any{"token": "flo1.nonsense", "error": "x"})
	require.Equal(t, http.StatusBadRequest, code, "%v", body)
	require.Contains(t, body["message"], "not a completion token")

	// Another service fails the second over gRPC: final, with its code.
	failed := make(chan error, 1)
	go func() {
		_, err := c.FailTask(ctx, tasks[second].token, flo.NewErrorWithCode("card_declined", "card declined"))
		failed <- err
	}()
	require.NoError(t, <-failed)
	end, err := c.AwaitTask(ctx, second, runWait)
	require.NoError(t, err)
	require.Equal(t, flo.TaskFailed, end.Status)
	require.Equal(t, "card declined", end.Error)
	require.Equal(t, "card_declined", end.ErrorCode)
	require.Equal(t, 1, end.Attempt, "no further attempt")
	_, err = c.CompleteTask(ctx, tasks[second].token, nil, "")
	require.ErrorContains(t, err, "is failed, not waiting")
}

// postJSONAsync is postJSON for a goroutine: it reports failures in its answer.
func postJSONAsync(url string, body any) (int, map[string]any) {
	data, err := json.Marshal(body)
	if err != nil {
		return 0, map[string]any{"error": err.Error()}
	}
	resp, err := restCall(http.MethodPost, url, data)
	if err != nil {
		return 0, map[string]any{"error": err.Error()}
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return resp.StatusCode, map[string]any{"error": err.Error()}
	}
	return resp.StatusCode, out
}

// TestAsyncStepOutcomes: a workflow step whose action completes asynchronously
// leaves its run waiting until then, and follows success with the result as
// its output; one whose async deadline passes follows timeout.
func TestAsyncStepOutcomes(t *testing.T) {
	_, c, handed := asyncStack(t, "approve", 1)
	ctx := context.Background()
	createWorkflow(t, c, timeoutFlow("approval", "approve"))

	// Completed by token.
	started, err := c.StartWorkflow(ctx, "approval", map[string]any{"wait_ms": time.Minute.Milliseconds()}, flo.StartWorkflowOptions{})
	require.NoError(t, err)
	p := <-handed
	// The run shows it waits for the result.
	require.Eventually(t, func() bool {
		run, err := c.GetRun(ctx, started.RunID)
		return err == nil && run.Status == flo.RunWaiting
	}, runWait, 10*time.Millisecond)
	_, err = c.CompleteTask(ctx, p.token, []byte(`{"approved_by":"ada"}`), "")
	require.NoError(t, err)
	st := statusJSON(t, awaitRun(t, c, started.RunID, flo.RunCompleted))
	require.Contains(t, runHistory(t, c, started.RunID), "action_waiting _start")
	require.Len(t, st.Outputs, 1)
	require.Equal(t, "success", st.Outputs[0].Outcome)
	require.JSONEq(t, `{"approved_by":"ada"}`, string(st.Outputs[0].Output))

	// Nobody answers within 200 ms.
	started, err = c.StartWorkflow(ctx, "approval", map[string]any{"wait_ms": 200}, flo.StartWorkflowOptions{})
	require.NoError(t, err)
	p = <-handed
	st = statusJSON(t, awaitRun(t, c, started.RunID, flo.RunFailed))
	require.Equal(t, "TooSlow", st.Terminal)
	require.Equal(t, "timeout", st.Outputs[0].Outcome)
	task, err := c.GetTask(ctx, p.id)
	require.NoError(t, err)
	require.True(t, task.TimedOut)
	require.Equal(t, flo.TaskFailed, task.Status)
	_, err = c.CompleteTask(ctx, p.token, nil, "")
	require.ErrorContains(t, err, "async deadline passed")
}
