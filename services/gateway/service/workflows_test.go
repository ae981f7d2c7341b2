package service_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/razorbill/flo/libs/config"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	workflow "github.com/razorbill/flo/services/workflow/service"
)

// orderActions are the actions the reference process-order workflow runs.
var orderActions = []string{"validate-order", "charge-payment", "create-shipment"}

// startWorkflowStack starts a dispatcher, a workflow service and a gateway.
func startWorkflowStack(t *testing.T) *stack {
	t.Helper()
	return newStack(t, stackOptions{workflow: true})
}

// startWorkflow starts a workflow service over the stack's database and
// broker. Its payload limit is above the gateway's, so an oversized input or
// signal is the gateway's to refuse.
func (s *stack) startWorkflow(t *testing.T) {
	t.Helper()
	svc, err := workflow.New(context.Background(), workflow.Config{
		GRPCAddr:        "127.0.0.1:0",
		HTTPAddr:        "127.0.0.1:0",
		MaxPayloadBytes: 2 * testMaxPayload,
		TimerTick:       time.Second,
		Postgres:        config.Postgres{URL: s.dbURL, MaxConns: 8},
		Auth:            s.auth,
		Kafka:           s.kafka(),
	}, s.log.With("service", "workflow"))
	require.NoError(t, err)
	s.workflowAddr = svc.GRPCAddr()
	run(t, svc.Run)
}

// processOrderYAML is the reference workflow as examples/workflows has it.
func processOrderYAML(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "workflows", "process-order.yaml"))
	require.NoError(t, err)
	return string(src)
}

// waitRun polls a run over gRPC until it has the status wanted.
func waitRun(t *testing.T, s *stack, id string, want flov1.RunStatus) *flov1.WorkflowRun {
	t.Helper()
	var run *flov1.WorkflowRun
	require.Eventually(t, func() bool {
		var err error
		run, err = s.workflows.GetRun(testContext(t), &flov1.GetRunRequest{Namespace: "default", RunId: id})
		require.NoError(t, err)
		return run.GetStatus() == want
	}, wait, 10*time.Millisecond, "run %s never reached %v (last: %v)", id, want, run)
	return run
}

func historyTypes(h *flov1.RunHistory) []string {
	out := make([]string, len(h.GetEvents()))
	for i, e := range h.GetEvents() {
		out[i] = e.GetType() + " " + e.GetStep()
	}
	return out
}

// completeNext hands the worker's next task of action back completed.
func completeNext(t *testing.T, w *rawWorker, action, body string) *flov1.TaskAssignment {
	t.Helper()
	w.ready(t, 1, 20_000)
	task := w.tasks(t, 1)[0]
	require.Equal(t, action, task.GetAction())
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(task.GetTaskId(), task.GetAttempt(), body)}})
	return task
}

// TestWorkflowsOverGRPC runs the reference process-order workflow through
// the gateway's WorkflowService, its actions done by a worker on the same
// gateway, and covers each call with the workflow service's answers
// arriving unchanged.
func TestWorkflowsOverGRPC(t *testing.T) {
	s := startWorkflowStack(t)
	ctx := testContext(t)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w1", Namespace: "default", Actions: orderActions})

	created, err := s.workflows.CreateWorkflow(ctx, &flov1.CreateWorkflowRequest{Namespace: "default", Yaml: processOrderYAML(t)})
	require.NoError(t, err)
	def := created.GetWorkflow()
	require.Equal(t, "process-order", def.GetName())
	require.Equal(t, "1.0.0", def.GetVersion())
	require.Equal(t, "required", def.GetIdempotency())
	require.Equal(t, []string{"charge", "ship"}, def.GetSteps())
	require.True(t, def.GetEnabled())

	got, err := s.workflows.GetWorkflow(ctx, &flov1.GetWorkflowRequest{Namespace: "default", Name: "process-order"})
	require.NoError(t, err)
	require.Equal(t, processOrderYAML(t), got.GetYaml())
	_, err = s.workflows.CreateWorkflow(ctx, &flov1.CreateWorkflowRequest{Namespace: "default", Yaml: processOrderYAML(t)})
	require.Equal(t, codes.AlreadyExists, status.Code(err), "%v", err)

	started, err := s.workflows.StartRun(ctx, &flov1.StartRunRequest{
		Namespace: "default", Workflow: "process-order", Input: []byte(`{"order_id":"ORD-1","amount":42}`), IdempotencyKey: "order-1",
	})
	require.NoError(t, err)
	require.True(t, started.GetCreated())
	id := started.GetRunId()
	again, err := s.workflows.StartRun(ctx, &flov1.StartRunRequest{
		Namespace: "default", Workflow: "process-order", Input: []byte(`{}`), IdempotencyKey: "order-1",
	})
	require.NoError(t, err)
	require.Equal(t, id, again.GetRunId(), "same key, same run")
	require.False(t, again.GetCreated())

	run, err := s.workflows.GetRun(ctx, &flov1.GetRunRequest{Namespace: "default", RunId: id})
	require.NoError(t, err)
	require.Equal(t, flov1.RunStatus_RUN_STATUS_RUNNING, run.GetStatus())
	require.Equal(t, "_start", run.GetCurrentStep())
	require.JSONEq(t, `{"order_id":"ORD-1","amount":42}`, string(run.GetInput()))

	list, err := s.workflows.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: "default", Workflow: "process-order"})
	require.NoError(t, err)
	require.Len(t, list.GetRuns(), 1)
	require.Equal(t, id, list.GetRuns()[0].GetRunId())

	// A signal no step waits for is kept with the run.
	sig, err := s.workflows.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: "default", RunId: id, Type: "note", Payload: []byte(`{"from":"ops"}`)})
	require.NoError(t, err)
	require.NotEmpty(t, sig.GetSignalId())

	validate := completeNext(t, w, "validate-order", `{"valid":true}`)
	require.JSONEq(t, `{"order_id":"ORD-1","amount":42}`, string(validate.GetPayload()), "the step's input is the run's")
	completeNext(t, w, "charge-payment", `{"payment_id":"pay-1"}`)
	completeNext(t, w, "create-shipment", `{"tracking":"TRK-1"}`)
	done := waitRun(t, s, id, flov1.RunStatus_RUN_STATUS_COMPLETED)
	require.Equal(t, "flo.Completed", done.GetTerminal())
	require.Len(t, done.GetOutputs(), 3)
	require.Equal(t, "TRK-1", done.GetOutputs()[2].GetOutputValue().GetStructValue().GetFields()["tracking"].GetStringValue())

	history, err := s.workflows.GetRunHistory(ctx, &flov1.GetRunRequest{Namespace: "default", RunId: id})
	require.NoError(t, err)
	types := historyTypes(history)
	require.Equal(t, "workflow_started ", types[0])
	require.Contains(t, types, "signal_received _start")
	require.Equal(t, "workflow_completed ship", types[len(types)-1])

	_, err = s.workflows.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: "default", RunId: id, Type: "note"})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "has ended")

	t.Run("cancel", func(t *testing.T) {
		started, err := s.workflows.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "process-order", IdempotencyKey: "order-2"})
		require.NoError(t, err)
		cancelled, err := s.workflows.CancelRun(ctx, &flov1.CancelRunRequest{Namespace: "default", RunId: started.GetRunId(), Reason: "customer changed their mind"})
		require.NoError(t, err)
		require.Equal(t, flov1.RunStatus_RUN_STATUS_CANCELLED, cancelled.GetStatus())
		history, err := s.workflows.GetRunHistory(ctx, &flov1.GetRunRequest{Namespace: "default", RunId: started.GetRunId()})
		require.NoError(t, err)
		last := history.GetEvents()[len(history.GetEvents())-1]
		require.Equal(t, "workflow_cancelled", last.GetType())
		require.Equal(t, "customer changed their mind", last.GetDetail())
	})

	t.Run("disable refuses starts, enable allows them again", func(t *testing.T) {
		disabled, err := s.workflows.DisableWorkflow(ctx, &flov1.WorkflowNameRequest{Namespace: "default", Name: "process-order"})
		require.NoError(t, err)
		require.False(t, disabled.GetEnabled())
		_, err = s.workflows.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "process-order", IdempotencyKey: "order-3"})
		require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "process-order is disabled")
		enabled, err := s.workflows.EnableWorkflow(ctx, &flov1.WorkflowNameRequest{Namespace: "default", Name: "process-order"})
		require.NoError(t, err)
		require.True(t, enabled.GetEnabled())
		_, err = s.workflows.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "process-order", IdempotencyKey: "order-3"})
		require.NoError(t, err)
	})

	t.Run("bad input", func(t *testing.T) {
		_, err := s.workflows.CreateWorkflow(ctx, &flov1.CreateWorkflowRequest{Namespace: "default", Yaml: "kind: Workflow\nname: broken\nversion: 1\nstart:\n  run: \"@actions/x\"\n  transitons: {}\n"})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "invalid workflow definition: ")
		require.Contains(t, status.Convert(err).Message(), "E104 line 6:3 start.transitons")
		require.Contains(t, status.Convert(err).Message(), "did you mean transitions?")

		_, err = s.workflows.GetRun(ctx, &flov1.GetRunRequest{Namespace: "default", RunId: "not-a-run"})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), `run_id "not-a-run" is not a UUID`)

		_, err = s.workflows.StartRun(ctx, &flov1.StartRunRequest{
			Namespace: "default", Workflow: "process-order", IdempotencyKey: "big",
			InputValue: structpb.NewStringValue(strings.Repeat("x", testMaxPayload)),
		})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "limit is 4096")

		_, err = s.workflows.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "process-order"})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "the service's own checks pass through: %v", err)
		require.Contains(t, status.Convert(err).Message(), "requires an idempotency key")

		_, err = s.workflows.ListWorkflows(ctx, &flov1.ListWorkflowsRequest{Namespace: "nope"})
		require.Equal(t, codes.NotFound, status.Code(err), "%v", err)

		_, err = s.workflows.GetWorkflow(ctx, &flov1.GetWorkflowRequest{Namespace: "default", Name: "missing"})
		require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	})
}

// TestWorkflowsOverREST covers the REST routes of WorkflowService, with JSON
// values for inputs and signals, and the HTTP statuses of refusals.
func TestWorkflowsOverREST(t *testing.T) {
	s := startWorkflowStack(t)
	// The actions exist, so a run waits at its first step for a worker.
	for _, name := range orderActions {
		reg := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions", map[string]any{"name": name})
		require.Equal(t, http.StatusOK, reg.status, "%s", reg.raw)
	}

	checked := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows:validate", map[string]any{"yaml": processOrderYAML(t)})
	require.Equal(t, http.StatusOK, checked.status, "%s", checked.raw)
	require.Equal(t, true, checked.body["valid"])
	invalid := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows:validate", map[string]any{"yaml": "kind: Workflow\n"})
	require.Equal(t, http.StatusOK, invalid.status, "%s", invalid.raw)
	require.Nil(t, invalid.body["valid"], "false is left out")
	require.NotEmpty(t, invalid.body["diagnostics"])

	created := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows", map[string]any{"yaml": processOrderYAML(t)})
	require.Equal(t, http.StatusOK, created.status, "%s", created.raw)
	require.Equal(t, "process-order", created.body["workflow"].(map[string]any)["name"])

	got := s.rest(t, http.MethodGet, "/v1/namespaces/default/workflows/process-order", nil)
	require.Equal(t, http.StatusOK, got.status, "%s", got.raw)
	require.Equal(t, "1.0.0", got.body["version"])
	require.Equal(t, "@actions/validate-order", got.body["startTarget"])
	list := s.rest(t, http.MethodGet, "/v1/namespaces/default/workflows", nil)
	require.Equal(t, http.StatusOK, list.status, "%s", list.raw)
	require.Len(t, list.body["workflows"], 1)

	started := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows/process-order/runs", map[string]any{
		"inputValue": map[string]any{"order_id": "ORD-9", "note": "<fragile>"}, "idempotencyKey": "order-9",
	})
	require.Equal(t, http.StatusOK, started.status, "%s", started.raw)
	require.Equal(t, true, started.body["created"])
	id := started.body["runId"].(string)

	run := s.rest(t, http.MethodGet, "/v1/namespaces/default/runs/"+id, nil)
	require.Equal(t, http.StatusOK, run.status, "%s", run.raw)
	require.Equal(t, "RUN_STATUS_RUNNING", run.body["status"])
	require.Equal(t, "_start", run.body["currentStep"])
	require.Equal(t, map[string]any{"order_id": "ORD-9", "note": "<fragile>"}, run.body["inputValue"])

	runs := s.rest(t, http.MethodGet, "/v1/namespaces/default/runs?workflow=process-order&status=RUN_STATUS_RUNNING", nil)
	require.Equal(t, http.StatusOK, runs.status, "%s", runs.raw)
	listed := objects(t, runs.body["runs"])
	require.Len(t, listed, 1)
	require.Equal(t, id, listed[0]["runId"])

	sig := s.rest(t, http.MethodPost, "/v1/namespaces/default/runs/"+id+"/signals", map[string]any{
		"type": "note", "value": map[string]any{"from": "ops"},
	})
	require.Equal(t, http.StatusOK, sig.status, "%s", sig.raw)
	require.NotEmpty(t, sig.body["signalId"])

	cancelled := s.rest(t, http.MethodPost, "/v1/namespaces/default/runs/"+id+"/cancel", map[string]any{"reason": "duplicate order"})
	require.Equal(t, http.StatusOK, cancelled.status, "%s", cancelled.raw)
	require.Equal(t, "RUN_STATUS_CANCELLED", cancelled.body["status"])

	history := s.rest(t, http.MethodGet, "/v1/namespaces/default/runs/"+id+"/history", nil)
	require.Equal(t, http.StatusOK, history.status, "%s", history.raw)
	events := objects(t, history.body["events"])
	var types []string
	for _, e := range events {
		types = append(types, e["type"].(string))
	}
	require.Equal(t, "workflow_started", types[0])
	require.Contains(t, types, "signal_received")
	require.Equal(t, "workflow_cancelled", types[len(types)-1])

	late := s.rest(t, http.MethodPost, "/v1/namespaces/default/runs/"+id+"/signals", map[string]any{"type": "note"})
	require.Equal(t, http.StatusBadRequest, late.status, "%s", late.raw)
	require.EqualValues(t, codes.FailedPrecondition, late.body["code"])

	disabled := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows/process-order/disable", nil)
	require.Equal(t, http.StatusOK, disabled.status, "%s", disabled.raw)
	require.Nil(t, disabled.body["enabled"], "false is left out")
	refused := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows/process-order/runs", map[string]any{"idempotencyKey": "order-10"})
	require.Equal(t, http.StatusBadRequest, refused.status, "%s", refused.raw)
	require.EqualValues(t, codes.FailedPrecondition, refused.body["code"])
	require.Contains(t, refused.body["message"], "process-order is disabled")
	enabled := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows/process-order/enable", nil)
	require.Equal(t, http.StatusOK, enabled.status, "%s", enabled.raw)
	require.Equal(t, true, enabled.body["enabled"])
}

func TestWorkflowsBadInputOverREST(t *testing.T) {
	s := startWorkflowStack(t)
	created := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows", map[string]any{"yaml": processOrderYAML(t)})
	require.Equal(t, http.StatusOK, created.status, "%s", created.raw)
	const runID = "0b9c7f5e-8a4a-4d57-9d0e-4f7f7f2b9d11"
	oversized := map[string]any{"inputValue": strings.Repeat("x", testMaxPayload), "idempotencyKey": "k"}

	tests := []struct {
		name   string
		method string
		path   string
		body   any
		status int
		code   codes.Code
		msg    string
	}{
		{"invalid definition lists its diagnostics", http.MethodPost, "/v1/namespaces/default/workflows",
			map[string]any{"yaml": "kind: Workflow\nname: w\nversion: \"1\"\nstart:\n  run: \"@actions/a\"\n  transitions:\n    success: nowhere\n"},
			http.StatusBadRequest, codes.InvalidArgument, "invalid workflow definition: E3"},
		{"unknown field in the body", http.MethodPost, "/v1/namespaces/default/workflows",
			map[string]any{"yml": "kind: Workflow"}, http.StatusBadRequest, codes.InvalidArgument, "yml"},
		{"unknown namespace", http.MethodGet, "/v1/namespaces/nope/workflows", nil,
			http.StatusNotFound, codes.NotFound, `namespace "nope" not found`},
		{"bad workflow name", http.MethodGet, "/v1/namespaces/default/workflows/-bad", nil,
			http.StatusBadRequest, codes.InvalidArgument, `name "-bad" is invalid`},
		{"bad version", http.MethodGet, "/v1/namespaces/default/workflows/process-order?version=1%200", nil,
			http.StatusBadRequest, codes.InvalidArgument, `version "1 0" is invalid`},
		{"unknown workflow", http.MethodPost, "/v1/namespaces/default/workflows/missing/runs",
			map[string]any{"idempotencyKey": "k"}, http.StatusNotFound, codes.NotFound, "workflow missing not found"},
		{"input over the limit", http.MethodPost, "/v1/namespaces/default/workflows/process-order/runs",
			oversized, http.StatusBadRequest, codes.InvalidArgument, "input is 4098 bytes, limit is 4096"},
		{"input not JSON", http.MethodPost, "/v1/namespaces/default/workflows/process-order/runs",
			map[string]any{"input": "bm90IGpzb24=", "idempotencyKey": "k"}, http.StatusBadRequest, codes.InvalidArgument, "input is not valid JSON"},
		{"run id not a UUID", http.MethodGet, "/v1/namespaces/default/runs/run-1", nil,
			http.StatusBadRequest, codes.InvalidArgument, `run_id "run-1" is not a UUID`},
		{"unknown run", http.MethodGet, "/v1/namespaces/default/runs/" + runID + "/history", nil,
			http.StatusNotFound, codes.NotFound, "not found"},
		{"bad signal type", http.MethodPost, "/v1/namespaces/default/runs/" + runID + "/signals",
			map[string]any{"type": "-go"}, http.StatusBadRequest, codes.InvalidArgument, `type "-go" is invalid`},
		{"signal payload over the limit", http.MethodPost, "/v1/namespaces/default/runs/" + runID + "/signals",
			map[string]any{"type": "go", "value": strings.Repeat("x", testMaxPayload)}, http.StatusBadRequest, codes.InvalidArgument, "payload is 4098 bytes, limit is 4096"},
		{"bad run status filter", http.MethodGet, "/v1/namespaces/default/runs?status=RUN_STATUS_NOPE", nil,
			http.StatusBadRequest, codes.InvalidArgument, "RUN_STATUS_NOPE"},
		{"list limit over the maximum", http.MethodGet, "/v1/namespaces/default/runs?limit=5000", nil,
			http.StatusBadRequest, codes.InvalidArgument, "limit must be between"},
		{"plans of an unknown workflow", http.MethodGet, "/v1/namespaces/default/workflows/missing/plans", nil,
			http.StatusNotFound, codes.NotFound, "workflow missing not found"},
		{"plans of an unknown version", http.MethodGet, "/v1/namespaces/default/workflows/process-order/plans?version=9", nil,
			http.StatusNotFound, codes.NotFound, "workflow process-order version 9 not found"},
		{"plan cache invalidation without event", http.MethodPost, "/v1/namespaces/default/plan-cache:invalidate",
			map[string]any{"key": "k"}, http.StatusBadRequest, codes.InvalidArgument, "event is required"},
		{"plan cache invalidation of a bad event", http.MethodPost, "/v1/namespaces/default/plan-cache:invalidate",
			map[string]any{"event": "-refunded"}, http.StatusBadRequest, codes.InvalidArgument, `event "-refunded" is invalid`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := s.rest(t, tc.method, tc.path, tc.body)
			require.Equal(t, tc.status, resp.status, "%s", resp.raw)
			require.EqualValues(t, tc.code, resp.body["code"], "%s", resp.raw)
			require.Contains(t, resp.body["message"], tc.msg)
		})
	}
	runs := s.rest(t, http.MethodGet, "/v1/namespaces/default/runs", nil)
	require.Equal(t, http.StatusOK, runs.status, "%s", runs.raw)
	require.Empty(t, runs.body["runs"], "no refused start made a run")
}

// TestWorkflowsNotConfigured runs a gateway without a workflow service:
// workflow calls are refused with Unavailable, the rest works.
func TestWorkflowsNotConfigured(t *testing.T) {
	s := startStack(t)
	resp := s.rest(t, http.MethodGet, "/v1/namespaces/default/workflows", nil)
	require.Equal(t, http.StatusServiceUnavailable, resp.status, "%s", resp.raw)
	require.Contains(t, resp.body["message"], "workflow service not configured")
	_, err := s.workflows.StartRun(testContext(t), &flov1.StartRunRequest{Namespace: "default", Workflow: "w"})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	ns, err := s.namespaces.ListNamespaces(testContext(t), &flov1.ListNamespacesRequest{})
	require.NoError(t, err)
	require.NotEmpty(t, ns.GetNamespaces())
}

// TestStartRunCarriesTheCallersTrace starts runs with a trace context over
// gRPC and REST: the gateway passes it to the workflow service, and the
// tasks of the runs' first steps reach the worker in the callers' traces.
func TestStartRunCarriesTheCallersTrace(t *testing.T) {
	s := startWorkflowStack(t)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "traced", Namespace: "default", Actions: orderActions})
	_, err := s.workflows.CreateWorkflow(testContext(t), &flov1.CreateWorkflowRequest{Namespace: "default", Yaml: processOrderYAML(t)})
	require.NoError(t, err)
	const grpcTrace, restTrace = "4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c"

	ctx := metadata.AppendToOutgoingContext(testContext(t), "traceparent", "00-"+grpcTrace+"-00f067aa0ba902b7-01")
	_, err = s.workflows.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "process-order", IdempotencyKey: "grpc"})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(testContext(t), http.MethodPost, s.base+"/v1/namespaces/default/workflows/process-order/runs",
		strings.NewReader(`{"idempotencyKey":"rest"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("traceparent", "00-"+restTrace+"-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	w.ready(t, 2, 20_000)
	tasks := w.tasks(t, 2)
	traces := tasks[0].GetTraceContext()["traceparent"] + " " + tasks[1].GetTraceContext()["traceparent"]
	require.Contains(t, traces, grpcTrace)
	require.Contains(t, traces, restTrace)
}
