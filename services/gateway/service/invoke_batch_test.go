package service_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func TestInvokeTasksQueuesTheWholeBatch(t *testing.T) {
	s := startStack(t)
	ctx := testContext(t)
	_, err := s.actions.RegisterAction(ctx, &flov1.RegisterActionRequest{Namespace: "default", Name: "known"})
	require.NoError(t, err)

	resp, err := s.tasks.InvokeTasks(ctx, &flov1.InvokeTasksRequest{Namespace: "default", Tasks: []*flov1.InvokeTaskRequest{
		{Action: "known", Payload: []byte(`{"n":1}`)},
		{Namespace: "default", Action: "known", IdempotencyKey: "k-1"},
		{Action: "known", IdempotencyKey: "k-1"},
	}})
	require.NoError(t, err)
	ids := resp.GetTaskIds()
	require.Len(t, ids, 3)
	require.Equal(t, ids[1], ids[2], "one idempotency key names one task")

	// Over REST, in request order.
	rest := s.rest(t, http.MethodPost, "/v1/namespaces/default/tasks:invoke", map[string]any{
		"tasks": []map[string]any{{"action": "known", "input": map[string]any{"n": 2}}, {"action": "known"}},
	})
	require.Equal(t, http.StatusOK, rest.status, "%s", rest.raw)
	restIDs, _ := rest.body["taskIds"].([]any)
	require.Len(t, restIDs, 2)
	for _, id := range restIDs {
		ids = append(ids, id.(string))
	}
	got := commandKeys(t, s.brokers)
	slices.Sort(got)
	slices.Sort(ids)
	require.Equal(t, ids, got, "every item became exactly one command")

	// Each task runs: its commands were applied like single invocations.
	for _, id := range slices.Compact(ids) {
		task, err := s.tasks.GetTask(ctx, &flov1.GetTaskRequest{Namespace: "default", TaskId: id})
		for err != nil && status.Code(err) == codes.NotFound && ctx.Err() == nil {
			task, err = s.tasks.AwaitTask(ctx, &flov1.AwaitTaskRequest{Namespace: "default", TaskId: id, TimeoutMs: 100})
		}
		require.NoError(t, err)
		require.Equal(t, flov1.TaskStatus_TASK_STATUS_QUEUED, task.GetStatus())
	}
}

func TestInvokeTasksRefusesABadBatchWhole(t *testing.T) {
	s := startStack(t)
	ctx := testContext(t)
	_, err := s.actions.RegisterAction(ctx, &flov1.RegisterActionRequest{Namespace: "default", Name: "known"})
	require.NoError(t, err)
	good := &flov1.InvokeTaskRequest{Action: "known"}
	many := func(n int, item *flov1.InvokeTaskRequest) []*flov1.InvokeTaskRequest {
		out := make([]*flov1.InvokeTaskRequest, n)
		for i := range out {
			out[i] = item
		}
		return out
	}

	tests := []struct {
		name    string
		req     *flov1.InvokeTasksRequest
		code    codes.Code
		message string
	}{
		{"empty batch", &flov1.InvokeTasksRequest{Namespace: "default"}, codes.InvalidArgument, "at least one"},
		{"too many items", &flov1.InvokeTasksRequest{Namespace: "default", Tasks: many(1001, good)}, codes.InvalidArgument, "limit is 1000"},
		{"unknown namespace", &flov1.InvokeTasksRequest{Namespace: "nope", Tasks: many(1, good)}, codes.NotFound, `namespace "nope" not found`},
		{"item of another namespace", &flov1.InvokeTasksRequest{Namespace: "default", Tasks: []*flov1.InvokeTaskRequest{good, {Namespace: "other", Action: "known"}}},
			codes.InvalidArgument, "tasks[1]: namespace"},
		{"item without action", &flov1.InvokeTasksRequest{Namespace: "default", Tasks: []*flov1.InvokeTaskRequest{good, good, {}}},
			codes.InvalidArgument, "tasks[2]: action is required"},
		{"item of an unknown action", &flov1.InvokeTasksRequest{Namespace: "default", Tasks: []*flov1.InvokeTaskRequest{good, {Action: "unknown"}}},
			codes.NotFound, `tasks[1]: action "unknown" not found`},
		{"item with a negative delay", &flov1.InvokeTasksRequest{Namespace: "default", Tasks: []*flov1.InvokeTaskRequest{{Action: "known", DelayMs: -1}}},
			codes.InvalidArgument, "tasks[0]: delay_ms"},
		{"item over the payload limit", &flov1.InvokeTasksRequest{Namespace: "default", Tasks: []*flov1.InvokeTaskRequest{good, {Action: "known", Payload: make([]byte, testMaxPayload+1)}}},
			codes.InvalidArgument, "tasks[1]: payload is"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.tasks.InvokeTasks(ctx, tc.req)
			require.Equal(t, tc.code, status.Code(err), "error: %v", err)
			require.Contains(t, status.Convert(err).Message(), tc.message)
		})
	}

	rest := s.rest(t, http.MethodPost, "/v1/namespaces/default/tasks:invoke", map[string]any{
		"tasks": []map[string]any{{"action": "known"}, {"action": "unknown"}},
	})
	require.Equal(t, http.StatusNotFound, rest.status, "%s", rest.raw)
	msg, _ := rest.body["message"].(string)
	require.True(t, strings.HasPrefix(msg, "tasks[1]: "), "%s", rest.raw)

	require.Empty(t, commandKeys(t, s.brokers), "a refused batch queues nothing")
}
