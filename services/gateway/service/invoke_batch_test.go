package service_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
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
		{"item over the trace context limit", &flov1.InvokeTasksRequest{Namespace: "default", Tasks: []*flov1.InvokeTaskRequest{good, {Action: "known",
			TraceContext: map[string]string{"baggage": strings.Repeat("k=v,", 2048)}}}},
			codes.InvalidArgument, "tasks[1]: trace_context is 8199 bytes, limit is 8192"},
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

// Each item of a batch gathered from many callers names its own caller's
// trace; an item that names none takes the call's.
func TestInvokeTasksItemsKeepTheirCallersTrace(t *testing.T) {
	s := startStack(t)
	ctx := testContext(t)
	_, err := s.actions.RegisterAction(ctx, &flov1.RegisterActionRequest{Namespace: "default", Name: "known"})
	require.NoError(t, err)
	const (
		first  = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		second = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		call   = "00-11111111111111111111111111111111-2222222222222222-01"
	)
	resp, err := s.tasks.InvokeTasks(metadata.AppendToOutgoingContext(ctx, "traceparent", call), &flov1.InvokeTasksRequest{Namespace: "default", Tasks: []*flov1.InvokeTaskRequest{
		{Action: "known", TraceContext: map[string]string{"traceparent": first}},
		{Action: "known", TraceContext: map[string]string{"traceparent": second}},
		{Action: "known"},
	}})
	require.NoError(t, err)

	traceIDs := map[string]string{}
	for _, r := range commandRecords(t, s.brokers) {
		for _, h := range r.Headers {
			if h.Key == "traceparent" {
				traceIDs[string(r.Key)] = strings.Split(string(h.Value), "-")[1]
			}
		}
	}
	ids := resp.GetTaskIds()
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", traceIDs[ids[0]])
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", traceIDs[ids[1]])
	require.Equal(t, "11111111111111111111111111111111", traceIDs[ids[2]], "an item without its own trace context is in the call's trace")
}
