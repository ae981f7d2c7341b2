package service_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/config"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	dispatcher "github.com/razorbill/flo/services/dispatcher/service"
)

// TestWorkerClaimsReachEveryDispatcherReplica runs two dispatcher replicas,
// each owning one of the two task partitions, behind one gateway configured
// with the first's address only: a worker gets the tasks of both partitions,
// each once, and completes them.
func TestWorkerClaimsReachEveryDispatcherReplica(t *testing.T) {
	s := startStack(t)
	second, err := dispatcher.New(context.Background(), dispatcher.Config{
		GRPCAddr:            "127.0.0.1:0",
		HTTPAddr:            "127.0.0.1:0",
		BootstrapNamespaces: []string{"default"},
		Postgres:            config.Postgres{URL: s.dbURL, MaxConns: 8},
		Auth:                s.auth,
		Kafka:               s.kafka(),
	}, s.log.With("service", "dispatcher-2"))
	require.NoError(t, err)
	run(t, second.Run)
	require.Eventually(t, func() bool {
		resp, err := s.dispatcher.ListReplicas(testContext(t), &dispatcherv1.ListReplicasRequest{})
		return err == nil && len(resp.GetReplicas()) == 2
	}, wait, 20*time.Millisecond, "the two replicas never split the partitions")

	w := openWorker(t, s, &flov1.Hello{WorkerId: "w1", Namespace: "default", Actions: []string{"split"}})
	const n = 40
	ids := map[string]bool{}
	for i := range n {
		ids[invoke(t, s, "split", fmt.Sprintf(`{"n":%d}`, i))] = true
	}
	seen := map[string]bool{}
	deadline := time.Now().Add(wait)
	for len(seen) < n && time.Now().Before(deadline) {
		w.ready(t, n, 2_000)
		for _, task := range w.next(t).GetTaskBatch().GetTasks() {
			require.True(t, ids[task.GetTaskId()], "unexpected task %s", task.GetTaskId())
			require.False(t, seen[task.GetTaskId()], "task %s handed out twice", task.GetTaskId())
			seen[task.GetTaskId()] = true
			w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(task.GetTaskId(), task.GetAttempt(), `"ok"`)}})
		}
	}
	require.Len(t, seen, n, "tasks of both replicas' partitions reached the worker")
	for id := range ids {
		awaitStatus(t, s, id, flov1.TaskStatus_TASK_STATUS_COMPLETED)
	}
}
