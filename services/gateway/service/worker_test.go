package service_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// rawWorker drives a worker stream by hand with the generated client, the
// way the SDK does, so the tests see the protocol itself.
type rawWorker struct {
	stream flov1.WorkerService_StreamClient
	msgs   chan *flov1.ServerMessage
	done   chan error
}

func openWorker(t *testing.T, s *stack, hello *flov1.Hello) *rawWorker {
	t.Helper()
	stream, err := s.workers.Stream(testContext(t))
	require.NoError(t, err)
	require.NoError(t, stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: hello}}))
	first, err := stream.Recv()
	require.NoError(t, err)
	ack := first.GetHelloAck()
	require.NotNil(t, ack, "first server message: %v", first)
	require.Equal(t, hello.GetNamespace(), ack.GetNamespace())
	require.True(t, ack.GetStreamHeartbeats(), "the gateway takes heartbeats on the stream")
	if hello.GetWorkerId() != "" {
		require.Equal(t, hello.GetWorkerId(), ack.GetWorkerId())
	}
	w := &rawWorker{stream: stream, msgs: make(chan *flov1.ServerMessage, 1024), done: make(chan error, 1)}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				w.done <- err
				close(w.msgs)
				return
			}
			w.msgs <- m
		}
	}()
	t.Cleanup(func() { _ = stream.CloseSend() })
	return w
}

func (w *rawWorker) send(t *testing.T, m *flov1.WorkerMessage) {
	t.Helper()
	require.NoError(t, w.stream.Send(m))
}

func (w *rawWorker) ready(t *testing.T, count int32, blockMS int64, actions ...string) {
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Ready{Ready: &flov1.Ready{
		Actions: actions, Count: count, BlockMs: blockMS,
	}}})
}

// next returns the next server message.
func (w *rawWorker) next(t *testing.T) *flov1.ServerMessage {
	t.Helper()
	select {
	case m, ok := <-w.msgs:
		if !ok {
			require.FailNow(t, "stream ended", "%v", <-w.done)
		}
		return m
	case <-time.After(wait):
		require.FailNow(t, "no server message")
		return nil
	}
}

// tasks collects n tasks from non-empty TaskBatches.
func (w *rawWorker) tasks(t *testing.T, n int) []*flov1.TaskAssignment {
	t.Helper()
	var got []*flov1.TaskAssignment
	for len(got) < n {
		m := w.next(t)
		b := m.GetTaskBatch()
		require.NotNil(t, b, "expected a TaskBatch, got %v", m)
		got = append(got, b.GetTasks()...)
	}
	require.Len(t, got, n)
	return got
}

func completed(id string, attempt int32, body string) *flov1.Result {
	return &flov1.Result{TaskId: id, Attempt: attempt, Outcome: &flov1.Result_Completed{Completed: &flov1.Completed{Body: []byte(body)}}}
}

func invoke(t *testing.T, s *stack, action, payload string) string {
	t.Helper()
	resp, err := s.tasks.InvokeTask(testContext(t), &flov1.InvokeTaskRequest{Namespace: "default", Action: action, Payload: []byte(payload)})
	require.NoError(t, err)
	return resp.GetTaskId()
}

func awaitStatus(t *testing.T, s *stack, id string, want flov1.TaskStatus) *flov1.Task {
	t.Helper()
	var task *flov1.Task
	require.Eventually(t, func() bool {
		var err error
		task, err = s.tasks.AwaitTask(testContext(t), &flov1.AwaitTaskRequest{Namespace: "default", TaskId: id, TimeoutMs: 5000})
		return err == nil && task.GetStatus() == want
	}, wait, 10*time.Millisecond, "task %s never reached %v (last: %v)", id, want, task)
	return task
}

func TestWorkerStreamSession(t *testing.T) {
	s := startStack(t)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w1", Namespace: "default", Actions: []string{"resize"}})

	// The Hello made the unknown action known with default settings.
	a, err := s.actions.GetAction(testContext(t), &flov1.GetActionRequest{Namespace: "default", Name: "resize"})
	require.NoError(t, err)
	require.True(t, a.GetEnabled())

	ids := map[string]bool{}
	for i := range 3 {
		ids[invoke(t, s, "resize", fmt.Sprintf(`{"n":%d}`, i))] = true
	}

	w.ready(t, 3, 20_000)
	got := w.tasks(t, 3)
	for _, task := range got {
		require.True(t, ids[task.GetTaskId()], "unexpected task %s", task.GetTaskId())
		require.Equal(t, "resize", task.GetAction())
		require.EqualValues(t, 1, task.GetAttempt())
		require.NotNil(t, task.GetLeaseUntil())
	}

	t.Run("touch extends the lease", func(t *testing.T) {
		w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Touch{Touch: &flov1.Touch{
			TaskId: got[0].GetTaskId(), Attempt: 1, ExtendMs: 600_000,
		}}})
		ack := w.next(t).GetTouchAck()
		require.NotNil(t, ack)
		require.True(t, ack.GetOk(), ack.GetError())
		require.Equal(t, got[0].GetTaskId(), ack.GetTaskId())
		require.True(t, ack.GetLeaseUntil().AsTime().After(got[0].GetLeaseUntil().AsTime()))
	})

	t.Run("abandon returns a task without counting an attempt", func(t *testing.T) {
		w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Abandon{Abandon: &flov1.Abandon{
			TaskId: got[2].GetTaskId(), Attempt: 1,
		}}})
		w.ready(t, 1, 20_000)
		again := w.tasks(t, 1)[0]
		require.Equal(t, got[2].GetTaskId(), again.GetTaskId())
		require.EqualValues(t, 1, again.GetAttempt())
	})

	t.Run("a result batch completes the tasks", func(t *testing.T) {
		batch := &flov1.ResultBatch{}
		for _, task := range got {
			batch.Results = append(batch.Results, completed(task.GetTaskId(), task.GetAttempt(), `{"ok":true}`))
		}
		w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_ResultBatch{ResultBatch: batch}})
		for _, task := range got {
			done := awaitStatus(t, s, task.GetTaskId(), flov1.TaskStatus_TASK_STATUS_COMPLETED)
			require.JSONEq(t, `{"ok":true}`, string(done.GetResult()))
			require.Equal(t, "w1", done.GetWorkerId())
		}
	})

	t.Run("a result for a finished task is rejected", func(t *testing.T) {
		w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(got[0].GetTaskId(), 1, `{}`)}})
		ack := w.next(t).GetResultAck()
		require.NotNil(t, ack)
		require.Equal(t, []string{got[0].GetTaskId()}, ack.GetRejectedTaskIds())
		require.NotEmpty(t, ack.GetError())
	})

	t.Run("a Ready with nothing to claim gets an empty batch when its block time passes", func(t *testing.T) {
		w.ready(t, 1, 50)
		m := w.next(t)
		require.NotNil(t, m.GetTaskBatch(), "expected a TaskBatch, got %v", m)
		require.Empty(t, m.GetTaskBatch().GetTasks())
	})

	t.Run("a nack requeues the task and counts the attempt", func(t *testing.T) {
		id := invoke(t, s, "resize", `{}`)
		w.ready(t, 1, 20_000)
		task := w.tasks(t, 1)[0]
		require.Equal(t, id, task.GetTaskId())
		w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Nack{Nack: &flov1.Nack{TaskId: id, Attempt: 1, DelayMs: 1, Reason: "busy"}}})
		w.ready(t, 1, 20_000)
		retried := w.tasks(t, 1)[0]
		require.Equal(t, id, retried.GetTaskId())
		require.EqualValues(t, 2, retried.GetAttempt(), "a nack counts the attempt")
		w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(id, 2, `"done"`)}})
		awaitStatus(t, s, id, flov1.TaskStatus_TASK_STATUS_COMPLETED)
	})
}

func TestOversizedResultDeadLettersTheTask(t *testing.T) {
	s := startStack(t)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, Namespace: "default", Actions: []string{"big"}})
	id := invoke(t, s, "big", `{}`)
	w.ready(t, 1, 20_000)
	task := w.tasks(t, 1)[0]
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(id, task.GetAttempt(), strings.Repeat("x", testMaxPayload+1))}})
	got := awaitStatus(t, s, id, flov1.TaskStatus_TASK_STATUS_DEAD_LETTERED)
	require.Contains(t, got.GetError(), "result is 4097 bytes, limit is 4096")
}

func TestWorkerStreamRefusals(t *testing.T) {
	s := startStack(t)
	recvErr := func(t *testing.T, first *flov1.WorkerMessage) error {
		stream, err := s.workers.Stream(testContext(t))
		require.NoError(t, err)
		require.NoError(t, stream.Send(first))
		_, err = stream.Recv()
		require.Error(t, err)
		return err
	}
	tests := []struct {
		name  string
		first *flov1.WorkerMessage
		code  codes.Code
	}{
		{
			name:  "missing Hello",
			first: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Ready{Ready: &flov1.Ready{Actions: []string{"x"}, Count: 1}}},
			code:  codes.InvalidArgument,
		},
		{
			name:  "wrong token",
			first: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{Token: "nope", Namespace: "default", Actions: []string{"x"}}}},
			code:  codes.Unauthenticated,
		},
		{
			name:  "unknown namespace",
			first: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{Token: adminToken, Namespace: "nope", Actions: []string{"x"}}}},
			code:  codes.NotFound,
		},
		{
			name:  "negative max_concurrency",
			first: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{Token: adminToken, Namespace: "default", Actions: []string{"x"}, MaxConcurrency: -1}}},
			code:  codes.InvalidArgument,
		},
		{
			name:  "empty namespace",
			first: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{Token: adminToken, Actions: []string{"x"}}}},
			code:  codes.InvalidArgument,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := recvErr(t, tc.first)
			require.Equal(t, tc.code, status.Code(err), "error: %v", err)
		})
	}
	// None of the refused Hellos registered its action.
	list, err := s.actions.ListActions(testContext(t), &flov1.ListActionsRequest{Namespace: "default"})
	require.NoError(t, err)
	require.Empty(t, list.GetActions())

	t.Run("a second Hello ends the stream", func(t *testing.T) {
		w := openWorker(t, s, &flov1.Hello{Token: adminToken, Namespace: "default", Actions: []string{"y"}})
		w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{Token: adminToken, Namespace: "default"}}})
		_, ok := <-w.msgs
		require.False(t, ok)
		require.Equal(t, codes.InvalidArgument, status.Code(<-w.done))
	})
}
