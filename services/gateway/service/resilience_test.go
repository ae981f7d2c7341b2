package service_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestWorkerStreamSurvivesDispatcherRestart stops the dispatcher under an
// open worker stream with outstanding credit: the stream stays open, an
// action invoked before can still be invoked (the gateway only writes to the
// log), and once a new dispatcher serves the same database the worker gets
// that task and completes it.
func TestWorkerStreamSurvivesDispatcherRestart(t *testing.T) {
	s := startStack(t)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "steady", Namespace: "default", Actions: []string{"job"}})
	first := invoke(t, s, "job", `{}`)
	w.ready(t, 1, 600_000)
	task := w.tasks(t, 1)[0]
	require.Equal(t, first, task.GetTaskId())
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(first, task.GetAttempt(), `"ok"`)}})
	awaitStatus(t, s, first, flov1.TaskStatus_TASK_STATUS_COMPLETED)

	w.ready(t, 1, 600_000)
	require.NoError(t, s.stopDispatch())
	id := invoke(t, s, "job", `{"during":"restart"}`)
	s.startDispatcher(t)

	task = w.tasks(t, 1)[0]
	require.Equal(t, id, task.GetTaskId())
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(id, task.GetAttempt(), `"ok"`)}})
	awaitStatus(t, s, id, flov1.TaskStatus_TASK_STATUS_COMPLETED)
}

// TestShutdownDrainsWorkerStreams stops the gateway while a worker holds a
// task: the gateway stops handing out work, waits for the worker's result,
// records it and only then ends the stream with Unavailable.
func TestShutdownDrainsWorkerStreams(t *testing.T) {
	s := startStack(t)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "drained", Namespace: "default", Actions: []string{"job"}})
	id := invoke(t, s, "job", `{}`)
	w.ready(t, 1, 600_000)
	task := w.tasks(t, 1)[0]
	require.Equal(t, id, task.GetTaskId())

	stopped := make(chan error, 1)
	go func() { stopped <- s.stopGateway() }()
	require.Eventually(t, func() bool { return !s.gateway.Ready() }, wait, time.Millisecond)

	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(id, task.GetAttempt(), `"finished during shutdown"`)}})
	for range w.msgs {
		// Drain until the stream ends; nothing but acknowledgements may come.
	}
	require.Equal(t, codes.Unavailable, status.Code(<-w.done))
	require.NoError(t, <-stopped)

	got, err := s.dispatcher.GetTask(testContext(t), &flov1.GetTaskRequest{Namespace: "default", TaskId: id})
	require.NoError(t, err)
	require.Equal(t, flov1.TaskStatus_TASK_STATUS_COMPLETED, got.GetStatus())
	require.JSONEq(t, `"finished during shutdown"`, string(got.GetResult()))
}
