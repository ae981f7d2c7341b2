package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/gateway/internal/namespace"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	workflowv1 "github.com/razorbill/flo/proto/gen/flo/workflow/v1"
)

// ErrNoWorkflows is the status of every workflow call on a gateway without a
// workflow service.
var ErrNoWorkflows = status.Error(codes.Unavailable, "workflow service not configured (FLO_WORKFLOW_ADDR)")

// WorkflowServer implements flov1.WorkflowServiceServer by forwarding to the
// workflow service, which owns definitions, runs, signals and history and
// whose status codes (the diagnostics of an invalid definition among them)
// reach the caller unchanged. The gateway checks the namespace, as for every
// call, the names, and the payload limit of a run's input and a signal's
// payload. A JSON value sent by a REST caller becomes raw JSON here, as for
// tasks and stream records, so the limit applies to the bytes that travel.
type WorkflowServer struct {
	flov1.UnimplementedWorkflowServiceServer

	workflows       workflowv1.WorkflowsClient
	namespaces      *namespace.Cache
	maxPayloadBytes int
	log             *slog.Logger
}

// NewWorkflowServer returns a WorkflowServer backed by the workflow service;
// a nil client means there is none, and every call fails with
// ErrNoWorkflows.
func NewWorkflowServer(workflows workflowv1.WorkflowsClient, namespaces *namespace.Cache, maxPayloadBytes int, log *slog.Logger) *WorkflowServer {
	return &WorkflowServer{workflows: workflows, namespaces: namespaces, maxPayloadBytes: maxPayloadBytes, log: log}
}

// check refuses a call when there is no workflow service, then checks the
// namespace and the checks given, stopping at the first failure.
func (s *WorkflowServer) check(ctx context.Context, ns string, checks ...error) error {
	if s.workflows == nil {
		return ErrNoWorkflows
	}
	if err := CheckNamespace(ctx, s.log, s.namespaces, ns); err != nil {
		return err
	}
	for _, err := range checks {
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

// CreateWorkflow stores a new workflow version; the workflow service
// validates the YAML and lists every problem it finds.
func (s *WorkflowServer) CreateWorkflow(ctx context.Context, req *flov1.CreateWorkflowRequest) (*flov1.CreateWorkflowResponse, error) {
	if err := s.check(ctx, req.GetNamespace()); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "create workflow", s.workflows.CreateWorkflow, req)
}

// ValidateWorkflow checks YAML without storing it.
func (s *WorkflowServer) ValidateWorkflow(ctx context.Context, req *flov1.ValidateWorkflowRequest) (*flov1.ValidateWorkflowResponse, error) {
	if err := s.check(ctx, req.GetNamespace()); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "validate workflow", s.workflows.ValidateWorkflow, req)
}

// GetWorkflow returns one version of a workflow, the latest by default.
func (s *WorkflowServer) GetWorkflow(ctx context.Context, req *flov1.GetWorkflowRequest) (*flov1.WorkflowDefinition, error) {
	if err := s.check(ctx, req.GetNamespace(), text.Name("name", req.GetName()), checkVersion(req.GetVersion())); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "get workflow", s.workflows.GetWorkflow, req)
}

// ListWorkflows lists a namespace's workflows, optionally of one name.
func (s *WorkflowServer) ListWorkflows(ctx context.Context, req *flov1.ListWorkflowsRequest) (*flov1.ListWorkflowsResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), checkOptionalWorkflowName("name", req.GetName())); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "list workflows", s.workflows.ListWorkflows, req)
}

// DisableWorkflow refuses new runs of every version of a workflow.
func (s *WorkflowServer) DisableWorkflow(ctx context.Context, req *flov1.WorkflowNameRequest) (*flov1.WorkflowDefinition, error) {
	if err := s.check(ctx, req.GetNamespace(), text.Name("name", req.GetName())); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "disable workflow", s.workflows.DisableWorkflow, req)
}

// EnableWorkflow lets new runs of a workflow start again.
func (s *WorkflowServer) EnableWorkflow(ctx context.Context, req *flov1.WorkflowNameRequest) (*flov1.WorkflowDefinition, error) {
	if err := s.check(ctx, req.GetNamespace(), text.Name("name", req.GetName())); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "enable workflow", s.workflows.EnableWorkflow, req)
}

// StartRun starts a run; the workflow service refuses disabled workflows
// (FailedPrecondition) and input that is not JSON.
func (s *WorkflowServer) StartRun(ctx context.Context, req *flov1.StartRunRequest) (*flov1.StartRunResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), text.Name("workflow", req.GetWorkflow()), checkVersion(req.GetVersion()),
		text.Key("idempotency_key", req.GetIdempotencyKey())); err != nil {
		return nil, err
	}
	input, err := s.payload("input", req.GetInput(), req.GetInputValue())
	if err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "start run", s.workflows.StartRun, &flov1.StartRunRequest{
		Namespace: req.GetNamespace(), Workflow: req.GetWorkflow(), Version: req.GetVersion(),
		Input: input, IdempotencyKey: req.GetIdempotencyKey(),
	})
}

// GetRun returns a run's status, input and step outputs.
func (s *WorkflowServer) GetRun(ctx context.Context, req *flov1.GetRunRequest) (*flov1.WorkflowRun, error) {
	if err := s.check(ctx, req.GetNamespace(), checkRunID(req.GetRunId())); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "get run", s.workflows.GetRun, req)
}

// ListRuns lists a namespace's runs newest first; the workflow service
// checks the filter's status, times, limit and page token.
func (s *WorkflowServer) ListRuns(ctx context.Context, req *flov1.ListRunsRequest) (*flov1.ListRunsResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), checkOptionalWorkflowName("workflow", req.GetWorkflow())); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "list runs", s.workflows.ListRuns, req)
}

// SignalRun delivers a signal to a run; runs that ended refuse it
// (FailedPrecondition).
func (s *WorkflowServer) SignalRun(ctx context.Context, req *flov1.SignalRunRequest) (*flov1.SignalRunResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), checkRunID(req.GetRunId()), text.SignalType("type", req.GetType())); err != nil {
		return nil, err
	}
	payload, err := s.payload("payload", req.GetPayload(), req.GetValue())
	if err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "signal run", s.workflows.SignalRun, &flov1.SignalRunRequest{
		Namespace: req.GetNamespace(), RunId: req.GetRunId(), Type: req.GetType(), Payload: payload,
	})
}

// CancelRun cancels a run and the child runs it waits for.
func (s *WorkflowServer) CancelRun(ctx context.Context, req *flov1.CancelRunRequest) (*flov1.WorkflowRun, error) {
	if err := s.check(ctx, req.GetNamespace(), checkRunID(req.GetRunId())); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "cancel run", s.workflows.CancelRun, req)
}

// GetRunHistory returns a run's history in order.
func (s *WorkflowServer) GetRunHistory(ctx context.Context, req *flov1.GetRunRequest) (*flov1.RunHistory, error) {
	if err := s.check(ctx, req.GetNamespace(), checkRunID(req.GetRunId())); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "get run history", s.workflows.GetRunHistory, req)
}

// GetWorkflowPlans shows a workflow version's plans with each executor's
// health and breaker on the workflow service replica that answers.
func (s *WorkflowServer) GetWorkflowPlans(ctx context.Context, req *flov1.GetWorkflowPlansRequest) (*flov1.WorkflowPlans, error) {
	if err := s.check(ctx, req.GetNamespace(), text.Name("name", req.GetName()), checkVersion(req.GetVersion())); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "get workflow plans", s.workflows.GetWorkflowPlans, req)
}

// InvalidatePlanCache removes the cached plan outcomes an event
// invalidates. Events follow the signal type rule, as the definition's
// invalidate_on entries do.
func (s *WorkflowServer) InvalidatePlanCache(ctx context.Context, req *flov1.InvalidatePlanCacheRequest) (*flov1.InvalidatePlanCacheResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), text.SignalType("event", req.GetEvent()), text.Storable("key", req.GetKey())); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "invalidate plan cache", s.workflows.InvalidatePlanCache, req)
}

// ListSchedules lists a namespace's workflow schedules; the workflow
// service checks the limit and page token.
func (s *WorkflowServer) ListSchedules(ctx context.Context, req *flov1.ListSchedulesRequest) (*flov1.ListSchedulesResponse, error) {
	if err := s.check(ctx, req.GetNamespace()); err != nil {
		return nil, err
	}
	return forward(ctx, s.log, "list schedules", s.workflows.ListSchedules, req)
}

// forward makes a checked call on the workflow service; its status reaches
// the caller unchanged.
func forward[Req, Resp any](ctx context.Context, log *slog.Logger, doing string, call func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	resp, err := call(ctx, req)
	if err != nil {
		var none Resp
		return none, upstream(ctx, log, doing, err)
	}
	return resp, nil
}

// payload returns a request's JSON as bytes, raw when given, else the JSON
// value encoded, and refuses it beyond the payload limit.
func (s *WorkflowServer) payload(field string, raw []byte, value *structpb.Value) ([]byte, error) {
	if len(raw) == 0 && value != nil {
		var err error
		if raw, err = encodeJSON(value); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "encode %s as JSON: %v", field, err)
		}
	}
	if len(raw) > s.maxPayloadBytes {
		return nil, status.Errorf(codes.InvalidArgument, "%s is %d bytes, limit is %d", field, len(raw), s.maxPayloadBytes)
	}
	return raw, nil
}

// checkOptionalWorkflowName accepts an empty name, which filters nothing.
func checkOptionalWorkflowName(field, name string) error {
	if name == "" {
		return nil
	}
	return text.Name(field, name)
}

// checkVersion accepts an empty version, which means the latest.
func checkVersion(version string) error {
	if version == "" {
		return nil
	}
	return text.Version("version", version)
}

// checkRunID refuses ids that cannot name a run; run ids are UUIDs.
func checkRunID(id string) error {
	if id == "" {
		return errors.New("run_id is required")
	}
	if _, err := uuid.Parse(id); err != nil {
		return fmt.Errorf("run_id %q is not a UUID", id)
	}
	return nil
}
