// Package grpcapi is the dispatcher's gRPC transport: it decodes requests,
// calls the domain packages and encodes their answers. Domain errors become
// status codes in one place, grpcserver.ErrorInterceptor, with the
// dispatcher's own errors added by dispatcherStatus.
package grpcapi

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/grpcserver"
	"github.com/razorbill/flo/libs/millis"
	"github.com/razorbill/flo/libs/page"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/apikey"
	"github.com/razorbill/flo/services/dispatcher/internal/catalog"
	"github.com/razorbill/flo/services/dispatcher/internal/claim"
	"github.com/razorbill/flo/services/dispatcher/internal/completion"
	"github.com/razorbill/flo/services/dispatcher/internal/lease"
	"github.com/razorbill/flo/services/dispatcher/internal/queue"
	"github.com/razorbill/flo/services/dispatcher/internal/report"
)

// maxMessageBytes lets report batches carry many large results.
const maxMessageBytes = 256 << 20

// Deps are the domain parts the API serves.
type Deps struct {
	Catalog  *catalog.Catalog
	Claimer  *claim.Claimer
	Reporter *report.Reporter
	Leases   *lease.Leases
	Queue    *queue.Queue
	// Completions finishes waiting tasks by completion token.
	Completions *completion.Completions
	// Keys makes, lists, revokes and reads API keys.
	Keys *apikey.Keys
	Log  *slog.Logger
}

// Server implements dispatcherv1.DispatcherServer.
type Server struct {
	dispatcherv1.UnimplementedDispatcherServer
	d Deps
}

// NewGRPCServer returns a gRPC server with the Dispatcher service registered,
// refusing calls without auth's internal credential, and the tracing,
// recovery and error-mapping interceptors installed.
func NewGRPCServer(d Deps, auth config.Auth) (*grpc.Server, error) {
	s, err := grpcserver.NewInternal(auth, d.Log, dispatcherStatus,
		grpc.MaxRecvMsgSize(maxMessageBytes),
		grpc.MaxSendMsgSize(maxMessageBytes),
	)
	if err != nil {
		return nil, err
	}
	dispatcherv1.RegisterDispatcherServer(s, &Server{d: d})
	return s, nil
}

// CreateNamespace creates a namespace, returning it unchanged when it exists.
func (s *Server) CreateNamespace(ctx context.Context, req *flov1.CreateNamespaceRequest) (*flov1.Namespace, error) {
	n, err := s.d.Catalog.CreateNamespace(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return namespaceProto(n), nil
}

// GetNamespace reads a namespace.
func (s *Server) GetNamespace(ctx context.Context, req *flov1.GetNamespaceRequest) (*flov1.Namespace, error) {
	n, err := s.d.Catalog.GetNamespace(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return namespaceProto(n), nil
}

// ListNamespaces lists namespaces.
func (s *Server) ListNamespaces(ctx context.Context, req *flov1.ListNamespacesRequest) (*flov1.ListNamespacesResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 1)
	if err != nil {
		return nil, err
	}
	ns, next, err := s.d.Catalog.ListNamespaces(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &flov1.ListNamespacesResponse{Namespaces: make([]*flov1.Namespace, len(ns)), NextPageToken: next}
	for i, n := range ns {
		out.Namespaces[i] = namespaceProto(n)
	}
	return out, nil
}

// RegisterAction creates or updates an action.
func (s *Server) RegisterAction(ctx context.Context, req *flov1.RegisterActionRequest) (*flov1.Action, error) {
	spec := catalog.Spec{TimeoutMS: req.GetTimeoutMs(), MaxAttempts: req.GetMaxAttempts()}
	if b := req.GetBackoff(); b != nil {
		spec.Backoff = &catalog.BackoffSpec{
			Kind: backoffKindName(b.GetKind()), InitialMS: b.GetInitialDelayMs(),
			MaxMS: b.GetMaxDelayMs(), Multiplier: b.GetMultiplier(),
		}
	}
	a, err := s.d.Catalog.Register(ctx, req.GetNamespace(), req.GetName(), spec)
	if err != nil {
		return nil, err
	}
	return actionProto(a), nil
}

// EnsureActions makes actions known with default settings.
func (s *Server) EnsureActions(ctx context.Context, req *dispatcherv1.EnsureActionsRequest) (*dispatcherv1.EnsureActionsResponse, error) {
	as, err := s.d.Catalog.Ensure(ctx, req.GetNamespace(), req.GetNames())
	if err != nil {
		return nil, err
	}
	return &dispatcherv1.EnsureActionsResponse{Actions: actionsProto(as)}, nil
}

// GetAction reads an action.
func (s *Server) GetAction(ctx context.Context, req *flov1.GetActionRequest) (*flov1.Action, error) {
	a, err := s.d.Catalog.Get(ctx, req.GetNamespace(), req.GetName())
	if err != nil {
		return nil, err
	}
	return actionProto(a), nil
}

// ListActions lists a namespace's actions.
func (s *Server) ListActions(ctx context.Context, req *flov1.ListActionsRequest) (*flov1.ListActionsResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 1)
	if err != nil {
		return nil, err
	}
	as, next, err := s.d.Catalog.List(ctx, req.GetNamespace(), p)
	if err != nil {
		return nil, err
	}
	return &flov1.ListActionsResponse{Actions: actionsProto(as), NextPageToken: next}, nil
}

// SetActionEnabled enables or disables an action.
func (s *Server) SetActionEnabled(ctx context.Context, req *dispatcherv1.SetActionEnabledRequest) (*flov1.Action, error) {
	a, err := s.d.Catalog.SetEnabled(ctx, req.GetNamespace(), req.GetName(), req.GetEnabled())
	if err != nil {
		return nil, err
	}
	return actionProto(a), nil
}

// GetTask reads a task.
func (s *Server) GetTask(ctx context.Context, req *flov1.GetTaskRequest) (*flov1.Task, error) {
	t, err := s.d.Queue.Get(ctx, req.GetNamespace(), req.GetTaskId())
	if err != nil {
		return nil, err
	}
	return taskProto(t), nil
}

// ListDeadLetters lists dead-lettered tasks.
func (s *Server) ListDeadLetters(ctx context.Context, req *flov1.ListDeadLettersRequest) (*flov1.ListDeadLettersResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 2)
	if err != nil {
		return nil, err
	}
	ts, next, err := s.d.Queue.ListDeadLetters(ctx, req.GetNamespace(), req.GetAction(), p)
	if err != nil {
		return nil, err
	}
	out := &flov1.ListDeadLettersResponse{Tasks: make([]*flov1.Task, len(ts)), NextPageToken: next}
	for i, t := range ts {
		out.Tasks[i] = taskProto(t)
	}
	return out, nil
}

// RequeueDeadLetter queues a dead-lettered task again.
func (s *Server) RequeueDeadLetter(ctx context.Context, req *flov1.GetTaskRequest) (*flov1.Task, error) {
	t, err := s.d.Queue.Requeue(ctx, req.GetNamespace(), req.GetTaskId())
	if err != nil {
		return nil, err
	}
	return taskProto(t), nil
}

// CompleteTask finishes a waiting task successfully by its completion token.
func (s *Server) CompleteTask(ctx context.Context, req *flov1.CompleteTaskRequest) (*flov1.Task, error) {
	t, err := s.d.Completions.Complete(ctx, req.GetNamespace(), req.GetToken(), req.GetResult(), req.GetOutcome())
	if err != nil {
		return nil, err
	}
	return taskProto(t), nil
}

// FailTask finishes a waiting task with a failure by its completion token.
func (s *Server) FailTask(ctx context.Context, req *flov1.FailTaskRequest) (*flov1.Task, error) {
	t, err := s.d.Completions.Fail(ctx, req.GetNamespace(), req.GetToken(), req.GetError(), req.GetErrorCode())
	if err != nil {
		return nil, err
	}
	return taskProto(t), nil
}

// Claim leases tasks to a worker, waiting up to wait_ms for some.
func (s *Server) Claim(ctx context.Context, req *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
	tasks, err := s.d.Claimer.Claim(ctx, claim.Request{
		Namespace: req.GetNamespace(),
		WorkerID:  req.GetWorkerId(),
		Actions:   req.GetActions(),
		Count:     int(req.GetCount()),
		Wait:      millis.Duration(req.GetWaitMs()),
		Lease:     millis.Duration(req.GetLeaseMs()),
	})
	if err != nil {
		return nil, err
	}
	out := &dispatcherv1.ClaimResponse{Tasks: make([]*flov1.TaskAssignment, len(tasks))}
	for i, t := range tasks {
		out.Tasks[i] = assignmentProto(t)
	}
	return out, nil
}

// Report records how attempts ended.
func (s *Server) Report(ctx context.Context, req *dispatcherv1.ReportRequest) (*dispatcherv1.ReportResponse, error) {
	reports := make([]report.Report, len(req.GetReports()))
	for i, r := range req.GetReports() {
		reports[i] = reportDomain(r)
	}
	rejected, err := s.d.Reporter.Report(ctx, report.Request{Namespace: req.GetNamespace(), Reports: reports})
	if err != nil {
		return nil, err
	}
	return &dispatcherv1.ReportResponse{RejectedTaskIds: rejected}, nil
}

// Touch extends a running attempt's lease. An attempt that is not running (or
// a malformed request) is answered with ok=false and the reason, not an RPC
// error, because the worker stream relays it as a TouchAck.
func (s *Server) Touch(ctx context.Context, req *dispatcherv1.TouchRequest) (*flov1.TouchAck, error) {
	until, err := s.d.Leases.Touch(ctx, req.GetNamespace(), req.GetTaskId(), req.GetAttempt(), millis.Duration(req.GetExtendMs()))
	if err != nil {
		msg, ok := touchRefusal(err)
		if !ok {
			return nil, err
		}
		return &flov1.TouchAck{TaskId: req.GetTaskId(), Ok: false, Error: msg}, nil
	}
	return &flov1.TouchAck{TaskId: req.GetTaskId(), Ok: true, LeaseUntil: timestamp(until)}, nil
}
