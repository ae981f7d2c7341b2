package service_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// The gateway reads task events only while an AwaitTask waits. With the
// broker away neither the events nor the task can be read, and the wait
// says so; once the broker is back, the tail reads again from the new
// broker and a result wakes the next wait.
func TestAwaitTaskWhileTheBrokerIsAway(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w1", Namespace: "default", Actions: []string{"resize"}})
	id := invoke(t, s, "resize", `{}`)

	s.broker.Close()
	_, err := s.tasks.AwaitTask(testContext(t), &flov1.AwaitTaskRequest{Namespace: "default", TaskId: id, TimeoutMs: 300})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	require.NoError(t, s.broker.Restart())
	w.ready(t, 1, 20_000)
	got := w.tasks(t, 1)
	require.Equal(t, id, got[0].GetTaskId())
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(id, 1, `"done"`)}})
	task := awaitStatus(t, s, id, flov1.TaskStatus_TASK_STATUS_COMPLETED)
	require.Equal(t, `"done"`, string(task.GetResult()))
}
