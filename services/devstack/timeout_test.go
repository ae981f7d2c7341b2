package devstack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
)

// timeoutFlow runs one action whose step has success, failure and timeout
// transitions, each to a terminal of its own, so the run's terminal says
// which one the step took.
func timeoutFlow(name, action string) string {
	return fmt.Sprintf(`
kind: Workflow
name: %s
version: "1"
start:
  run: "@actions/%s"
  transitions:
    success: flo.Completed
    failure: Broke
    timeout: TooSlow
terminals:
  Broke: {status: failed}
  TooSlow: {status: failed}
`, name, action)
}

// TestActionTimeoutOutcome checks that a task whose final attempt ran out of
// time takes its step's timeout transition, whether the SDK saw its handler
// pass its deadline or the dispatcher saw its lease expire, and that an
// ordinary error still takes the failure transition.
func TestActionTimeoutOutcome(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, "default")
	ctx := context.Background()
	backoff := &flo.Backoff{Kind: flo.BackoffConstant, Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond}
	// The handler's deadline is the worker's (300 ms); the action's lease is
	// long, so only the SDK can see this attempt time out.
	_, err := c.RegisterAction(ctx, "sleepy", flo.ActionOptions{Timeout: time.Minute, MaxAttempts: 1, Backoff: backoff})
	require.NoError(t, err)
	// The lease is short and the worker never touches it: both attempts
	// expire.
	_, err = c.RegisterAction(ctx, "silent", flo.ActionOptions{Timeout: 300 * time.Millisecond, MaxAttempts: 2, Backoff: backoff})
	require.NoError(t, err)
	_, err = c.RegisterAction(ctx, "broken", flo.ActionOptions{Timeout: time.Minute, MaxAttempts: 1, Backoff: backoff})
	require.NoError(t, err)

	taskIDs := make(chan string, 8)
	e.worker(t, "default", flo.ActionWorkerOptions{ActionTimeout: 300 * time.Millisecond}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("sleepy", func(actx *flo.ActionContext) ([]byte, error) {
			taskIDs <- actx.TaskID()
			<-actx.Done()
			return nil, actx.Err()
		})
	})
	// release lets the silent handlers return once the test is over; the
	// cleanup runs before the worker's, which waits for them.
	release := make(chan struct{})
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 4}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("silent", func(actx *flo.ActionContext) ([]byte, error) {
			taskIDs <- actx.TaskID()
			<-release
			return nil, errors.New("too late")
		})
		w.MustRegisterAction("broken", func(actx *flo.ActionContext) ([]byte, error) {
			taskIDs <- actx.TaskID()
			return nil, errors.New("upstream said no")
		})
	})
	t.Cleanup(func() { close(release) })
	waitActions(t, c, "sleepy", "silent", "broken")

	for _, tc := range []struct {
		action, terminal, outcome string
		taskStatus                flo.TaskStatus
		attempts                  int
		timedOut                  bool
	}{
		{action: "sleepy", terminal: "TooSlow", outcome: "timeout", taskStatus: flo.TaskFailed, attempts: 1, timedOut: true},
		{action: "silent", terminal: "TooSlow", outcome: "timeout", taskStatus: flo.TaskDeadLettered, attempts: 2, timedOut: true},
		{action: "broken", terminal: "Broke", outcome: "failure", taskStatus: flo.TaskDeadLettered, attempts: 1},
	} {
		t.Run(tc.action, func(t *testing.T) {
			createWorkflow(t, c, timeoutFlow("run-"+tc.action, tc.action))
			started, err := c.StartWorkflow(ctx, "run-"+tc.action, map[string]string{}, flo.StartWorkflowOptions{})
			require.NoError(t, err)
			st := statusJSON(t, awaitRun(t, c, started.RunID, flo.RunFailed))
			require.Equal(t, tc.terminal, st.Terminal)
			require.Len(t, st.Outputs, 1)
			require.Equal(t, tc.outcome, st.Outputs[0].Outcome)

			// Every attempt of the run's one task went through the worker.
			var id string
			for range tc.attempts {
				got := <-taskIDs
				require.True(t, id == "" || id == got, "attempts of one task")
				id = got
			}
			task, err := c.GetTask(ctx, id)
			require.NoError(t, err)
			require.Equal(t, tc.taskStatus, task.Status)
			require.Equal(t, tc.attempts, task.Attempt)
			require.Equal(t, tc.timedOut, task.TimedOut)
			// `flo task get` prints the task as JSON.
			b, err := json.Marshal(task)
			require.NoError(t, err)
			var printed map[string]any
			require.NoError(t, json.Unmarshal(b, &printed))
			require.Equal(t, tc.timedOut, printed["timed_out"] == true, "%s", b)
		})
	}
}
