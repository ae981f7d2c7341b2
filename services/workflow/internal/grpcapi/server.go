// Package grpcapi is the workflow service's gRPC transport: it decodes
// requests of the internal Workflows service, calls the catalog and the
// runner, and encodes their answers. Domain errors become status codes in
// grpcserver.ErrorInterceptor, with the workflow service's own errors added
// by workflowStatus.
package grpcapi

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/grpcserver"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/page"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	workflowv1 "github.com/razorbill/flo/proto/gen/flo/workflow/v1"
	"github.com/razorbill/flo/services/workflow/internal/catalog"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/runner"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// maxMessageBytes leaves room for definitions, inputs and payloads of up to
// a few MiB plus envelope; the domain checks the real limits.
const maxMessageBytes = 16 << 20

// Server implements workflowv1.WorkflowsServer.
type Server struct {
	workflowv1.UnimplementedWorkflowsServer
	catalog *catalog.Catalog
	runner  *runner.Runner
}

// NewGRPCServer returns a gRPC server with the Workflows service registered,
// refusing calls without auth's internal credential, and the tracing,
// recovery and error-mapping interceptors installed.
func NewGRPCServer(cat *catalog.Catalog, r *runner.Runner, log *slog.Logger, auth config.Auth) (*grpc.Server, error) {
	s, err := grpcserver.NewInternal(auth, log, workflowStatus,
		grpc.MaxRecvMsgSize(maxMessageBytes),
		grpc.MaxSendMsgSize(maxMessageBytes),
	)
	if err != nil {
		return nil, err
	}
	workflowv1.RegisterWorkflowsServer(s, &Server{catalog: cat, runner: r})
	return s, nil
}

// CreateWorkflow validates and stores a new workflow version.
func (s *Server) CreateWorkflow(ctx context.Context, req *flov1.CreateWorkflowRequest) (*flov1.CreateWorkflowResponse, error) {
	w, warnings, err := s.catalog.Create(ctx, req.GetNamespace(), req.GetYaml())
	var invalid *definition.ValidationError
	if errors.As(err, &invalid) {
		// Before the error interceptor, which would report only the
		// error's own message: this status lists every diagnostic.
		return nil, validationStatus(invalid)
	}
	if err != nil {
		return nil, err
	}
	return &flov1.CreateWorkflowResponse{Workflow: definitionProto(w), Warnings: diagnosticsProto(warnings)}, nil
}

// ValidateWorkflow checks a definition without storing it.
func (s *Server) ValidateWorkflow(_ context.Context, req *flov1.ValidateWorkflowRequest) (*flov1.ValidateWorkflowResponse, error) {
	checked, err := s.catalog.Validate(req.GetNamespace(), req.GetYaml())
	if err != nil {
		return nil, err
	}
	resp := &flov1.ValidateWorkflowResponse{Valid: checked.Def != nil, Diagnostics: diagnosticsProto(checked.Diagnostics)}
	if checked.Def != nil {
		resp.Workflow = definitionProto(checked.Workflow)
	}
	return resp, nil
}

// GetWorkflow reads one version, the latest when none is named.
func (s *Server) GetWorkflow(ctx context.Context, req *flov1.GetWorkflowRequest) (*flov1.WorkflowDefinition, error) {
	w, err := s.catalog.Get(ctx, req.GetNamespace(), req.GetName(), req.GetVersion())
	if err != nil {
		return nil, err
	}
	return definitionProto(w), nil
}

// ListWorkflows lists workflows, latest versions only unless asked for all.
func (s *Server) ListWorkflows(ctx context.Context, req *flov1.ListWorkflowsRequest) (*flov1.ListWorkflowsResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 3)
	if err != nil {
		return nil, err
	}
	ws, next, err := s.catalog.List(ctx, req.GetNamespace(), req.GetName(), req.GetAllVersions(), p)
	if err != nil {
		return nil, err
	}
	out := &flov1.ListWorkflowsResponse{Workflows: make([]*flov1.WorkflowDefinition, len(ws)), NextPageToken: next}
	for i, w := range ws {
		out.Workflows[i] = definitionProto(w)
	}
	return out, nil
}

// DisableWorkflow refuses new starts of every version of a workflow.
func (s *Server) DisableWorkflow(ctx context.Context, req *flov1.WorkflowNameRequest) (*flov1.WorkflowDefinition, error) {
	w, err := s.catalog.SetEnabled(ctx, req.GetNamespace(), req.GetName(), false)
	if err != nil {
		return nil, err
	}
	return definitionProto(w), nil
}

// EnableWorkflow lets new runs of a workflow start again.
func (s *Server) EnableWorkflow(ctx context.Context, req *flov1.WorkflowNameRequest) (*flov1.WorkflowDefinition, error) {
	w, err := s.catalog.SetEnabled(ctx, req.GetNamespace(), req.GetName(), true)
	if err != nil {
		return nil, err
	}
	return definitionProto(w), nil
}

// StartRun starts a run, or returns the one its idempotency key started.
func (s *Server) StartRun(ctx context.Context, req *flov1.StartRunRequest) (*flov1.StartRunResponse, error) {
	input, err := jsonOf("input", req.GetInput(), req.GetInputValue())
	if err != nil {
		return nil, err
	}
	res, err := s.runner.Start(ctx, runner.StartRequest{
		Namespace: req.GetNamespace(), Workflow: req.GetWorkflow(), Version: req.GetVersion(),
		Input: input, IdempotencyKey: req.GetIdempotencyKey(), TraceContext: kafka.TraceHeaders(ctx),
	})
	if err != nil {
		return nil, err
	}
	return &flov1.StartRunResponse{RunId: res.RunID, Created: res.Created}, nil
}

// GetRun reads a run's status.
func (s *Server) GetRun(ctx context.Context, req *flov1.GetRunRequest) (*flov1.WorkflowRun, error) {
	run, err := s.runner.Get(ctx, req.GetNamespace(), req.GetRunId())
	if err != nil {
		return nil, err
	}
	return runProto(run), nil
}

// ListRuns lists runs newest first, a page at a time.
func (s *Server) ListRuns(ctx context.Context, req *flov1.ListRunsRequest) (*flov1.ListRunsResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 2)
	if err != nil {
		return nil, err
	}
	f := store.RunFilter{Namespace: req.GetNamespace(), Workflow: req.GetWorkflow()}
	if req.GetStatus() != flov1.RunStatus_RUN_STATUS_UNSPECIFIED {
		st, ok := runner.StatusOf(req.GetStatus())
		if !ok {
			return nil, fault.Invalidf("status %d is not a run status", req.GetStatus())
		}
		f.Status = st
	}
	if req.GetCreatedAfter() != nil {
		f.CreatedAfter = req.GetCreatedAfter().AsTime()
	}
	if req.GetCreatedBefore() != nil {
		f.CreatedBefore = req.GetCreatedBefore().AsTime()
	}
	runs, next, err := s.runner.List(ctx, f, req.GetWhere(), p)
	if err != nil {
		return nil, err
	}
	out := &flov1.ListRunsResponse{NextPageToken: next}
	out.Runs = make([]*flov1.WorkflowRun, len(runs))
	for i, r := range runs {
		out.Runs[i] = runProto(r)
	}
	return out, nil
}

// SignalRun delivers a signal to a run.
func (s *Server) SignalRun(ctx context.Context, req *flov1.SignalRunRequest) (*flov1.SignalRunResponse, error) {
	payload, err := jsonOf("payload", req.GetPayload(), req.GetValue())
	if err != nil {
		return nil, err
	}
	id, err := s.runner.Signal(ctx, req.GetNamespace(), req.GetRunId(), req.GetType(), payload)
	if err != nil {
		return nil, err
	}
	return &flov1.SignalRunResponse{SignalId: id}, nil
}

// CancelRun cancels a run and the children it waits for.
func (s *Server) CancelRun(ctx context.Context, req *flov1.CancelRunRequest) (*flov1.WorkflowRun, error) {
	run, err := s.runner.Cancel(ctx, req.GetNamespace(), req.GetRunId(), req.GetReason())
	if err != nil {
		return nil, err
	}
	return runProto(run), nil
}

// GetRunHistory reads a run's history in order.
func (s *Server) GetRunHistory(ctx context.Context, req *flov1.GetRunRequest) (*flov1.RunHistory, error) {
	rows, err := s.runner.History(ctx, req.GetNamespace(), req.GetRunId())
	if err != nil {
		return nil, err
	}
	return historyProto(rows), nil
}

// jsonOf picks a request's JSON: raw bytes when set, else the JSON value
// REST callers send.
func jsonOf(field string, raw []byte, v *structpb.Value) ([]byte, error) {
	if len(raw) > 0 || v == nil {
		return raw, nil
	}
	b, err := protojson.Marshal(v)
	if err != nil {
		return nil, fault.Invalidf("%s_value: %v", field, err)
	}
	return b, nil
}
