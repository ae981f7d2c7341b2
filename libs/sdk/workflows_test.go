package flo_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// These tests hold the workflow calls to the wire: a peer plays the gateway's WorkflowService,
// answering with fixed data, and keeps every request. The end-to-end tests of `flo workflow`
// run the same calls against the real platform.

// workflowsPeer plays the gateway's WorkflowService.
type workflowsPeer struct {
	flov1.UnimplementedWorkflowServiceServer

	mu       sync.Mutex
	requests []proto.Message
	// runs answers GetRun calls in turn; the last one answers every call after it.
	runs []*flov1.WorkflowRun
	// getRunErrs fail the first GetRun calls, one error each.
	getRunErrs []error
}

func (w *workflowsPeer) keep(req proto.Message) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.requests = append(w.requests, req)
}

func (w *workflowsPeer) last() proto.Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.requests[len(w.requests)-1]
}

func (w *workflowsPeer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.requests)
}

func sampleDefinition(ns string) *flov1.WorkflowDefinition {
	return &flov1.WorkflowDefinition{
		Namespace: ns, Name: "process-order", Version: "1.0.0", Idempotency: "optional",
		StartTarget: "@actions/validate-order", Steps: []string{"validate", "charge"}, Yaml: "kind: Workflow\n",
		Enabled: true, Latest: true, CreatedAt: created,
	}
}

// rejection is the status the workflow service sends for a definition with errors: every
// diagnostic as a field violation, its code as the reason and its path as the field.
func rejection() error {
	st := status.New(codes.InvalidArgument, "invalid workflow definition: E301 line 12:5 steps.charge.transitions.success: unknown target")
	st, _ = st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: "steps.charge.transitions.success", Reason: "E301", Description: "E301 line 12:5 steps.charge.transitions.success: transition target \"shipp\" is not a step or terminal; did you mean \"ship\"?"},
		{Field: "", Reason: "E102", Description: "E102: start is required"},
		{Field: "version", Reason: "E106", Description: "E106 line 3 version: version \"1 0\" is malformed"},
		{Field: "steps.audit", Reason: "W301", Description: "W301 line 20:3 steps.audit: step is not reachable from start"},
	}})
	return st.Err()
}

func (w *workflowsPeer) CreateWorkflow(_ context.Context, req *flov1.CreateWorkflowRequest) (*flov1.CreateWorkflowResponse, error) {
	w.keep(req)
	if strings.Contains(req.GetYaml(), "invalid") {
		return nil, rejection()
	}
	return &flov1.CreateWorkflowResponse{
		Workflow: sampleDefinition(req.GetNamespace()),
		Warnings: []*flov1.Diagnostic{{
			Code: "W501", Severity: flov1.DiagnosticSeverity_DIAGNOSTIC_SEVERITY_WARNING,
			Message: "waitForSignal without timeoutMs waits forever", Line: 9, Column: 5, Path: "steps.approve.waitForSignal",
		}},
	}, nil
}

func (w *workflowsPeer) ValidateWorkflow(_ context.Context, req *flov1.ValidateWorkflowRequest) (*flov1.ValidateWorkflowResponse, error) {
	w.keep(req)
	return &flov1.ValidateWorkflowResponse{Valid: false, Diagnostics: []*flov1.Diagnostic{
		{Code: "E103", Severity: flov1.DiagnosticSeverity_DIAGNOSTIC_SEVERITY_ERROR, Message: "kind must be Workflow", Line: 1, Column: 7, Path: "kind"},
	}}, nil
}

func (w *workflowsPeer) GetWorkflow(_ context.Context, req *flov1.GetWorkflowRequest) (*flov1.WorkflowDefinition, error) {
	w.keep(req)
	if req.GetName() != "process-order" {
		return nil, status.Errorf(codes.NotFound, "workflow %q not found", req.GetName())
	}
	return sampleDefinition(req.GetNamespace()), nil
}

func (w *workflowsPeer) ListWorkflows(_ context.Context, req *flov1.ListWorkflowsRequest) (*flov1.ListWorkflowsResponse, error) {
	w.keep(req)
	return &flov1.ListWorkflowsResponse{Workflows: []*flov1.WorkflowDefinition{sampleDefinition(req.GetNamespace())}}, nil
}

func (w *workflowsPeer) DisableWorkflow(_ context.Context, req *flov1.WorkflowNameRequest) (*flov1.WorkflowDefinition, error) {
	w.keep(req)
	d := sampleDefinition(req.GetNamespace())
	d.Enabled = false
	return d, nil
}

func (w *workflowsPeer) EnableWorkflow(_ context.Context, req *flov1.WorkflowNameRequest) (*flov1.WorkflowDefinition, error) {
	w.keep(req)
	return sampleDefinition(req.GetNamespace()), nil
}

func (w *workflowsPeer) StartRun(_ context.Context, req *flov1.StartRunRequest) (*flov1.StartRunResponse, error) {
	w.keep(req)
	return &flov1.StartRunResponse{RunId: "run-1", Created: req.GetIdempotencyKey() == ""}, nil
}

func (w *workflowsPeer) GetRun(_ context.Context, req *flov1.GetRunRequest) (*flov1.WorkflowRun, error) {
	w.keep(req)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.getRunErrs) > 0 {
		err := w.getRunErrs[0]
		w.getRunErrs = w.getRunErrs[1:]
		return nil, err
	}
	run := w.runs[0]
	if len(w.runs) > 1 {
		w.runs = w.runs[1:]
	}
	return run, nil
}

func (w *workflowsPeer) ListRuns(_ context.Context, req *flov1.ListRunsRequest) (*flov1.ListRunsResponse, error) {
	w.keep(req)
	return &flov1.ListRunsResponse{Runs: []*flov1.WorkflowRun{sampleRun(flov1.RunStatus_RUN_STATUS_WAITING)}, NextPageToken: "page-2"}, nil
}

func (w *workflowsPeer) SignalRun(_ context.Context, req *flov1.SignalRunRequest) (*flov1.SignalRunResponse, error) {
	w.keep(req)
	return &flov1.SignalRunResponse{SignalId: "sig-1"}, nil
}

func (w *workflowsPeer) CancelRun(_ context.Context, req *flov1.CancelRunRequest) (*flov1.WorkflowRun, error) {
	w.keep(req)
	return sampleRun(flov1.RunStatus_RUN_STATUS_CANCELLED), nil
}

func (w *workflowsPeer) GetRunHistory(_ context.Context, req *flov1.GetRunRequest) (*flov1.RunHistory, error) {
	w.keep(req)
	return &flov1.RunHistory{Events: []*flov1.HistoryEvent{
		{Seq: 1, Type: "workflow_started", Detail: `{"order_id":"o-1"}`, At: created},
		{Seq: 2, Type: "step_started", Step: "validate", Attempt: 1, At: created},
	}}, nil
}

func sampleRun(st flov1.RunStatus) *flov1.WorkflowRun {
	value, _ := structpb.NewValue(map[string]any{"charged": true})
	return &flov1.WorkflowRun{
		RunId: "run-1", Namespace: "myapp", Workflow: "process-order", Version: "1.0.0", Status: st,
		CurrentStep: "approve", Input: []byte(`{"order_id":"o-1"}`), WaitingFor: "approval",
		Outputs: []*flov1.StepOutput{
			{Step: "validate", Outcome: "success", Output: []byte(`{"ok":true}`), Attempts: 1, FinishedAt: created},
			// Only the JSON value, as the gateway may leave it.
			{Step: "charge", Outcome: "success", OutputValue: value, Attempts: 2, FinishedAt: created},
		},
		IdempotencyKey: "order-1", CreatedAt: created, UpdatedAt: created,
	}
}

func startWorkflowsPeer(t *testing.T, w *workflowsPeer) *flo.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	flov1.RegisterWorkflowServiceServer(srv, w)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	client := flo.NewClient(lis.Addr().String(), flo.WithNamespace("myapp"))
	require.NoError(t, client.Connect())
	t.Cleanup(func() { _ = client.Close() })
	return client
}

func TestClientManagesWorkflows(t *testing.T) {
	t.Parallel()
	w := &workflowsPeer{}
	client := startWorkflowsPeer(t, w)
	ctx := context.Background()

	def, warnings, err := client.CreateWorkflow(ctx, "kind: Workflow\n")
	require.NoError(t, err)
	requireSent(t, &flov1.CreateWorkflowRequest{Namespace: "myapp", Yaml: "kind: Workflow\n"}, w.last())
	want := &flo.Workflow{
		Namespace: "myapp", Name: "process-order", Version: "1.0.0", Idempotency: "optional", StartTarget: "@actions/validate-order",
		Steps: []string{"validate", "charge"}, YAML: "kind: Workflow\n", Enabled: true, Latest: true, CreatedAt: created.AsTime(),
	}
	require.Equal(t, want, def)
	require.Equal(t, []flo.Diagnostic{{
		Code: "W501", Severity: flo.SeverityWarning, Message: "waitForSignal without timeoutMs waits forever",
		Line: 9, Column: 5, Path: "steps.approve.waitForSignal",
	}}, warnings)
	require.Equal(t, "9:5 W501 steps.approve.waitForSignal: waitForSignal without timeoutMs waits forever", warnings[0].String())
	b, err := json.Marshal(def)
	require.NoError(t, err)
	require.JSONEq(t, `{"namespace":"myapp","name":"process-order","version":"1.0.0","idempotency":"optional",
		"start_target":"@actions/validate-order","steps":["validate","charge"],"yaml":"kind: Workflow\n","enabled":true,"latest":true,
		"created_at":"2026-01-02T03:04:05Z"}`, string(b))

	v, err := client.ValidateWorkflow(ctx, "kind: Flow\n")
	require.NoError(t, err, "an invalid definition is a verdict, not an error")
	requireSent(t, &flov1.ValidateWorkflowRequest{Namespace: "myapp", Yaml: "kind: Flow\n"}, w.last())
	require.Equal(t, &flo.Validation{Diagnostics: []flo.Diagnostic{{
		Code: "E103", Severity: flo.SeverityError, Message: "kind must be Workflow", Line: 1, Column: 7, Path: "kind",
	}}}, v)

	got, err := client.GetWorkflow(ctx, "process-order", "1.0.0")
	require.NoError(t, err)
	requireSent(t, &flov1.GetWorkflowRequest{Namespace: "myapp", Name: "process-order", Version: "1.0.0"}, w.last())
	require.Equal(t, want, got)
	_, err = client.GetWorkflow(ctx, "ghost", "")
	require.Equal(t, codes.NotFound, status.Code(err))
	require.True(t, strings.HasPrefix(err.Error(), "get workflow ghost:"), err.Error())
	_, err = client.GetWorkflow(ctx, "ghost", "2.0.0")
	require.True(t, strings.HasPrefix(err.Error(), "get workflow ghost version 2.0.0:"), err.Error())

	list, err := client.ListWorkflows(ctx, flo.ListWorkflowsOptions{Name: "process-order", AllVersions: true})
	require.NoError(t, err)
	requireSent(t, &flov1.ListWorkflowsRequest{Namespace: "myapp", Name: "process-order", AllVersions: true, Limit: 1000}, w.last())
	require.Equal(t, []*flo.Workflow{want}, list)

	disabled, err := client.DisableWorkflow(ctx, "process-order")
	require.NoError(t, err)
	requireSent(t, &flov1.WorkflowNameRequest{Namespace: "myapp", Name: "process-order"}, w.last())
	require.False(t, disabled.Enabled)
	enabled, err := client.EnableWorkflow(ctx, "process-order")
	require.NoError(t, err)
	require.True(t, enabled.Enabled)
}

func TestCreateWorkflowReportsEveryDiagnostic(t *testing.T) {
	t.Parallel()
	client := startWorkflowsPeer(t, &workflowsPeer{})

	def, warnings, err := client.CreateWorkflow(context.Background(), "invalid")
	require.Nil(t, def)
	require.Nil(t, warnings)
	var invalid *flo.ValidationError
	require.ErrorAs(t, err, &invalid)
	require.Equal(t, codes.InvalidArgument, status.Code(err), "the status stays reachable")
	require.EqualError(t, err, `invalid workflow definition (3 errors): `+
		`12:5 E301 steps.charge.transitions.success: transition target "shipp" is not a step or terminal; did you mean "ship"?; `+
		`- E102: start is required; 3 E106 version: version "1 0" is malformed`)
	require.Equal(t, []flo.Diagnostic{
		{Code: "E301", Severity: flo.SeverityError, Line: 12, Column: 5, Path: "steps.charge.transitions.success",
			Message: `transition target "shipp" is not a step or terminal; did you mean "ship"?`},
		{Code: "E102", Severity: flo.SeverityError, Message: "start is required"},
		{Code: "E106", Severity: flo.SeverityError, Line: 3, Path: "version", Message: `version "1 0" is malformed`},
		{Code: "W301", Severity: flo.SeverityWarning, Line: 20, Column: 3, Path: "steps.audit", Message: "step is not reachable from start"},
	}, invalid.Diagnostics)
	require.Len(t, invalid.Errors(), 3)
	var lines []string
	for _, d := range invalid.Diagnostics {
		lines = append(lines, d.String())
	}
	require.Equal(t, []string{
		`12:5 E301 steps.charge.transitions.success: transition target "shipp" is not a step or terminal; did you mean "ship"?`,
		"- E102: start is required",
		`3 E106 version: version "1 0" is malformed`,
		"20:3 W301 steps.audit: step is not reachable from start",
	}, lines)

	many := &flo.ValidationError{}
	for _, code := range []string{"E401", "E402", "E403", "E404", "E501"} {
		many.Diagnostics = append(many.Diagnostics, flo.Diagnostic{Code: code, Severity: flo.SeverityError, Message: "x"})
	}
	require.EqualError(t, many, "invalid workflow definition (5 errors): - E401: x; - E402: x; - E403: x; and 2 more")
}

func TestClientStartsAndFollowsRuns(t *testing.T) {
	t.Parallel()
	w := &workflowsPeer{runs: []*flov1.WorkflowRun{sampleRun(flov1.RunStatus_RUN_STATUS_WAITING)}}
	client := startWorkflowsPeer(t, w)
	ctx := context.Background()

	started, err := client.StartWorkflow(ctx, "process-order", map[string]string{"order_id": "o-1"},
		flo.StartWorkflowOptions{Version: "1.0.0", IdempotencyKey: "order-1"})
	require.NoError(t, err)
	require.Equal(t, &flo.StartedRun{RunID: "run-1", Created: false}, started)
	requireSent(t, &flov1.StartRunRequest{
		Namespace: "myapp", Workflow: "process-order", Version: "1.0.0", Input: []byte(`{"order_id":"o-1"}`), IdempotencyKey: "order-1",
	}, w.last())
	_, err = client.StartWorkflow(ctx, "process-order", nil, flo.StartWorkflowOptions{})
	require.NoError(t, err)
	requireSent(t, &flov1.StartRunRequest{Namespace: "myapp", Workflow: "process-order"}, w.last())
	_, err = client.StartWorkflow(ctx, "process-order", func() {}, flo.StartWorkflowOptions{})
	require.ErrorContains(t, err, "start workflow process-order: input: encode payload")

	run, err := client.GetRun(ctx, "run-1")
	require.NoError(t, err)
	requireSent(t, &flov1.GetRunRequest{Namespace: "myapp", RunId: "run-1"}, w.last())
	require.Equal(t, flo.RunWaiting, run.Status)
	require.Equal(t, "approval", run.WaitingFor)
	require.Equal(t, "approve", run.CurrentStep)
	require.JSONEq(t, `{"order_id":"o-1"}`, string(run.Input))
	require.Len(t, run.Outputs, 2)
	var charged struct{ Charged bool }
	require.NoError(t, run.Output("charge").Into(&charged))
	require.True(t, charged.Charged, "an output sent only as a JSON value")
	require.Equal(t, 2, run.Output("charge").Attempts)
	require.Nil(t, run.Output("ship"))
	b, err := json.Marshal(run)
	require.NoError(t, err)
	require.JSONEq(t, `{"run_id":"run-1","namespace":"myapp","workflow":"process-order","version":"1.0.0",
		"status":"waiting","current_step":"approve","input":{"order_id":"o-1"},
		"outputs":[
			{"step":"validate","outcome":"success","output":{"ok":true},"attempts":1,"finished_at":"2026-01-02T03:04:05Z"},
			{"step":"charge","outcome":"success","output":{"charged":true},"attempts":2,"finished_at":"2026-01-02T03:04:05Z"}
		],
		"idempotency_key":"order-1","waiting_for":"approval",
		"created_at":"2026-01-02T03:04:05Z","updated_at":"2026-01-02T03:04:05Z"}`, string(b))

	after := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	runs, next, err := client.ListRuns(ctx, flo.RunFilter{
		Workflow: "process-order", Status: flo.RunWaiting, CreatedAfter: after, CreatedBefore: after.Add(time.Hour),
		Limit: 10, PageToken: "page-1",
	})
	require.NoError(t, err)
	requireSent(t, &flov1.ListRunsRequest{
		Namespace: "myapp", Workflow: "process-order", Status: flov1.RunStatus_RUN_STATUS_WAITING,
		CreatedAfter: timestamppb.New(after), CreatedBefore: timestamppb.New(after.Add(time.Hour)), Limit: 10, PageToken: "page-1",
	}, w.last())
	require.Equal(t, "page-2", next)
	require.Len(t, runs, 1)
	_, _, err = client.ListRuns(ctx, flo.RunFilter{})
	require.NoError(t, err)
	requireSent(t, &flov1.ListRunsRequest{Namespace: "myapp"}, w.last())
	sent := w.count()
	_, _, err = client.ListRuns(ctx, flo.RunFilter{Status: "done"})
	require.ErrorContains(t, err, `unknown run status "done"`)
	require.Equal(t, sent, w.count(), "a bad status is refused before any call")

	id, err := client.SignalRun(ctx, "run-1", "approval", map[string]string{"decision": "approved"})
	require.NoError(t, err)
	require.Equal(t, "sig-1", id)
	requireSent(t, &flov1.SignalRunRequest{Namespace: "myapp", RunId: "run-1", Type: "approval", Payload: []byte(`{"decision":"approved"}`)}, w.last())

	cancelled, err := client.CancelRun(ctx, "run-1", "customer asked")
	require.NoError(t, err)
	requireSent(t, &flov1.CancelRunRequest{Namespace: "myapp", RunId: "run-1", Reason: "customer asked"}, w.last())
	require.Equal(t, flo.RunCancelled, cancelled.Status)

	events, err := client.GetRunHistory(ctx, "run-1")
	require.NoError(t, err)
	requireSent(t, &flov1.GetRunRequest{Namespace: "myapp", RunId: "run-1"}, w.last())
	require.Equal(t, []*flo.HistoryEvent{
		{Seq: 1, Type: "workflow_started", Detail: `{"order_id":"o-1"}`, At: created.AsTime()},
		{Seq: 2, Type: "step_started", Step: "validate", Attempt: 1, At: created.AsTime()},
	}, events)
	b, err = json.Marshal(events[1])
	require.NoError(t, err)
	require.JSONEq(t, `{"seq":2,"type":"step_started","step":"validate","attempt":1,"at":"2026-01-02T03:04:05Z"}`, string(b))
}

func TestAwaitRunWaitsForAFinalStatus(t *testing.T) {
	t.Parallel()
	w := &workflowsPeer{
		runs: []*flov1.WorkflowRun{
			sampleRun(flov1.RunStatus_RUN_STATUS_RUNNING),
			sampleRun(flov1.RunStatus_RUN_STATUS_WAITING),
			sampleRun(flov1.RunStatus_RUN_STATUS_COMPLETED),
		},
		getRunErrs: []error{status.Error(codes.Unavailable, "gateway restarting")},
	}
	client := startWorkflowsPeer(t, w)

	run, err := client.AwaitRun(context.Background(), "run-1")
	require.NoError(t, err)
	require.Equal(t, flo.RunCompleted, run.Status)
	require.Equal(t, 4, w.count(), "an unavailable gateway, then running, waiting and completed")
}

func TestAwaitRunEndsWithItsContext(t *testing.T) {
	t.Parallel()
	w := &workflowsPeer{runs: []*flov1.WorkflowRun{sampleRun(flov1.RunStatus_RUN_STATUS_WAITING)}}
	client := startWorkflowsPeer(t, w)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	run, err := client.AwaitRun(ctx, "run-1")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "await run run-1: still waiting")
	require.NotNil(t, run, "the run as last seen")
	require.Equal(t, flo.RunWaiting, run.Status)

	w.mu.Lock()
	w.getRunErrs = []error{status.Error(codes.NotFound, "run ghost not found")}
	w.mu.Unlock()
	run, err = client.AwaitRun(context.Background(), "ghost")
	require.Nil(t, run)
	require.Equal(t, codes.NotFound, status.Code(err), "errors other than unavailability end the wait")
}

func TestRunStatuses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		final bool
	}{
		{"pending", false}, {"running", false}, {"waiting", false},
		{"completed", true}, {"failed", true}, {"cancelled", true}, {"timed_out", true},
	} {
		st, err := flo.ParseRunStatus(tt.name)
		require.NoError(t, err)
		require.Equal(t, tt.name, string(st))
		require.Equal(t, tt.final, st.Final(), tt.name)
	}
	_, err := flo.ParseRunStatus("done")
	require.ErrorContains(t, err, "want pending, running, waiting, completed, failed, cancelled or timed_out")
}

func TestWorkflowCallsNeedAConnection(t *testing.T) {
	t.Parallel()
	client := flo.NewClient("127.0.0.1:1")
	ctx := context.Background()
	_, _, err := client.CreateWorkflow(ctx, "kind: Workflow")
	require.ErrorIs(t, err, flo.ErrNotConnected)
	_, err = client.StartWorkflow(ctx, "process-order", nil, flo.StartWorkflowOptions{})
	require.ErrorIs(t, err, flo.ErrNotConnected)
	_, err = client.AwaitRun(ctx, "run-1")
	require.True(t, errors.Is(err, flo.ErrNotConnected), err)
}

// CreateWorkflow stores a new version; a definition with errors is not stored, and the error
// lists every diagnostic with its place in the YAML.
func ExampleClient_CreateWorkflow() {
	client := flo.NewClient("localhost:9000", flo.WithNamespace("myapp"))
	if err := client.Connect(); err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	yaml, err := os.ReadFile("process-order.yaml")
	if err != nil {
		log.Fatal(err)
	}
	def, warnings, err := client.CreateWorkflow(context.Background(), string(yaml))
	var invalid *flo.ValidationError
	if errors.As(err, &invalid) {
		for _, d := range invalid.Diagnostics {
			fmt.Println(d) // 8:14 E301 start.transitions.failure: ...
		}
		os.Exit(1)
	}
	if err != nil {
		log.Fatal(err)
	}
	for _, w := range warnings {
		fmt.Println(w)
	}
	fmt.Println(def.Name, def.Version)
}

// StartWorkflow returns the run's id at once; AwaitRun waits for the run to end. The same
// idempotency key starts one run however often it is sent.
func ExampleClient_StartWorkflow() {
	client := flo.NewClient("localhost:9000", flo.WithNamespace("myapp"))
	if err := client.Connect(); err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	started, err := client.StartWorkflow(ctx, "process-order", map[string]any{"order_id": "ORD-123", "amount": 99.99},
		flo.StartWorkflowOptions{IdempotencyKey: "order-ORD-123"})
	if err != nil {
		log.Fatal(err)
	}
	// A human approves the order; a signal sent before the step waits is kept until it does.
	if _, err := client.SignalRun(ctx, started.RunID, "manager_approval", map[string]string{"decision": "approved"}); err != nil {
		log.Fatal(err)
	}
	run, err := client.AwaitRun(ctx, started.RunID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Status, run.Terminal)
}
