package devstack_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
)

// TestErrorCode checks that a handler failing with a code has it on the task
// (GetTask and `flo task get`'s JSON), on the task's final event, and in a
// workflow run's history and error; and that an invalid code is dropped with
// a note in the error while the failure itself is recorded.
func TestErrorCode(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, "default")
	ctx := context.Background()
	for _, action := range []string{"charge", "charge-badcode"} {
		_, err := c.RegisterAction(ctx, action, flo.ActionOptions{Timeout: time.Minute, MaxAttempts: 3})
		require.NoError(t, err)
	}
	e.worker(t, "default", flo.ActionWorkerOptions{}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("charge", func(actx *flo.ActionContext) ([]byte, error) {
			return nil, flo.NewNonRetryableError(flo.NewErrorWithCode("card_declined", "card %s declined", "4242"))
		})
		w.MustRegisterAction("charge-badcode", func(actx *flo.ActionContext) ([]byte, error) {
			return nil, flo.NewNonRetryableError(flo.NewErrorWithCode("card declined!", "card declined"))
		})
	})
	waitActions(t, c, "charge", "charge-badcode")

	id, err := c.Invoke(ctx, "charge", map[string]string{})
	require.NoError(t, err)
	task, err := c.AwaitTask(ctx, id, runWait)
	require.NoError(t, err)
	require.Equal(t, flo.TaskFailed, task.Status)
	require.Equal(t, "card 4242 declined", task.Error)
	require.Equal(t, "card_declined", task.ErrorCode)
	// `flo task get` prints the task as JSON.
	b, err := json.Marshal(task)
	require.NoError(t, err)
	var printed map[string]any
	require.NoError(t, json.Unmarshal(b, &printed))
	require.Equal(t, "card_declined", printed["error_code"], "%s", b)
	require.Equal(t, "card_declined", failedEvent(t, e, id).GetErrorCode())

	badID, err := c.Invoke(ctx, "charge-badcode", map[string]string{})
	require.NoError(t, err)
	bad, err := c.AwaitTask(ctx, badID, runWait)
	require.NoError(t, err)
	require.Equal(t, flo.TaskFailed, bad.Status, "an invalid code does not change how the task fails")
	require.Empty(t, bad.ErrorCode)
	require.Contains(t, bad.Error, `card declined [dropped: error code "card declined!" is invalid`)

	createWorkflow(t, c, `
kind: Workflow
name: pay
version: "1"
start:
  run: "@actions/charge"
  transitions:
    success: flo.Completed
    failure: flo.Failed
`)
	started, err := c.StartWorkflow(ctx, "pay", map[string]string{}, flo.StartWorkflowOptions{})
	require.NoError(t, err)
	run := awaitRun(t, c, started.RunID, flo.RunFailed)
	require.Contains(t, run.Error, "card 4242 declined (error code card_declined)")
	evs, err := c.GetRunHistory(ctx, started.RunID)
	require.NoError(t, err)
	details := map[string]string{}
	for _, ev := range evs {
		details[ev.Type] = ev.Detail
	}
	require.Equal(t, "failure: card 4242 declined (error code card_declined)", details["action_completed"])
	require.Equal(t, "failure: card 4242 declined (error code card_declined)", details["step_completed"])
}

// failedEvent reads the task events until task id's FAILED event.
func failedEvent(t *testing.T, e *env, id string) *eventsv1.TaskEvent {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.broker.Addrs()...), kgo.ConsumeTopics(kafka.TaskEventsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), runWait)
	defer cancel()
	for {
		fetches := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "no FAILED event for task %s", id)
		var found *eventsv1.TaskEvent
		fetches.EachRecord(func(r *kgo.Record) {
			var ev eventsv1.TaskEvent
			require.NoError(t, proto.Unmarshal(r.Value, &ev))
			if ev.GetTaskId() == id && ev.GetType() == eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED {
				found = &ev
			}
		})
		if found != nil {
			return found
		}
	}
}
