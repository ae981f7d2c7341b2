// Package grpcapi is the dispatcher's gRPC transport: it decodes requests,
// calls the domain packages and encodes their answers. Domain errors become
// status codes in one place, grpcserver.ErrorInterceptor, with the
// dispatcher's own errors added by dispatcherStatus.
package grpcapi

import (
	"context"
	"log/slog"
	"sync"

	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/grpcserver"
	"github.com/razorbill/flo/libs/millis"
	"github.com/razorbill/flo/libs/page"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/apikey"
	"github.com/razorbill/flo/services/dispatcher/internal/catalog"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/owner"
	"github.com/razorbill/flo/services/dispatcher/internal/queue"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// maxMessageBytes lets report batches carry many large results.
const maxMessageBytes = 256 << 20

// Deps are the domain parts the API serves.
type Deps struct {
	Catalog *catalog.Catalog
	// Replica serves the task partitions this replica owns; Peers passes
	// calls about other partitions to their owners.
	Replica *owner.Replica
	Peers   *owner.Peers
	// Queue lists dead letters from the view.
	Queue *queue.Queue
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

// GetTask reads a task, at the owner of its partition.
func (s *Server) GetTask(ctx context.Context, req *flov1.GetTaskRequest) (*flov1.Task, error) {
	return s.taskCall(ctx, req.GetTaskId(),
		func(ctx context.Context) (store.Task, error) {
			return s.d.Replica.Get(ctx, req.GetNamespace(), req.GetTaskId())
		},
		func(ctx context.Context, c dispatcherv1.DispatcherClient) (*flov1.Task, error) {
			return c.GetTask(ctx, req)
		})
}

// ListDeadLetters lists dead-lettered tasks.
func (s *Server) ListDeadLetters(ctx context.Context, req *flov1.ListDeadLettersRequest) (*flov1.ListDeadLettersResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 2)
	if err != nil {
		return nil, err
	}
	// The view trails the partitions by a flush window; this replica's
	// share is written first (another replica's may trail by one window).
	if err := s.d.Replica.FlushView(ctx); err != nil {
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
	return s.taskCall(ctx, req.GetTaskId(),
		func(ctx context.Context) (store.Task, error) {
			return s.d.Replica.Requeue(ctx, req.GetNamespace(), req.GetTaskId())
		},
		func(ctx context.Context, c dispatcherv1.DispatcherClient) (*flov1.Task, error) {
			return c.RequeueDeadLetter(ctx, req)
		})
}

// CompleteTask finishes a waiting task successfully by its completion token.
func (s *Server) CompleteTask(ctx context.Context, req *flov1.CompleteTaskRequest) (*flov1.Task, error) {
	tok, err := engine.ParseToken(req.GetToken())
	if err != nil {
		return nil, err
	}
	f := engine.Finish{Result: req.GetResult(), Outcome: req.GetOutcome()}
	return s.taskCall(ctx, tok.ID.String(),
		func(ctx context.Context) (store.Task, error) {
			return s.d.Replica.Finish(ctx, req.GetNamespace(), req.GetToken(), f)
		},
		func(ctx context.Context, c dispatcherv1.DispatcherClient) (*flov1.Task, error) {
			return c.CompleteTask(ctx, req)
		})
}

// FailTask finishes a waiting task with a failure by its completion token.
func (s *Server) FailTask(ctx context.Context, req *flov1.FailTaskRequest) (*flov1.Task, error) {
	tok, err := engine.ParseToken(req.GetToken())
	if err != nil {
		return nil, err
	}
	f := engine.Finish{Failed: true, Error: req.GetError(), ErrorCode: req.GetErrorCode()}
	return s.taskCall(ctx, tok.ID.String(),
		func(ctx context.Context) (store.Task, error) {
			return s.d.Replica.Finish(ctx, req.GetNamespace(), req.GetToken(), f)
		},
		func(ctx context.Context, c dispatcherv1.DispatcherClient) (*flov1.Task, error) {
			return c.FailTask(ctx, req)
		})
}

// taskCall serves a call about one task here when this replica owns its
// partition, and passes it to the owner otherwise.
func (s *Server) taskCall(ctx context.Context, taskID string, local func(context.Context) (store.Task, error),
	remote func(context.Context, dispatcherv1.DispatcherClient) (*flov1.Task, error)) (*flov1.Task, error) {
	var out *flov1.Task
	err := s.d.Peers.Route(ctx, taskID,
		func(ctx context.Context) error {
			t, err := local(ctx)
			if err == nil {
				out = taskProto(t)
			}
			return err
		},
		func(ctx context.Context, c dispatcherv1.DispatcherClient) error {
			var err error
			out, err = remote(ctx, c)
			return err
		})
	return out, err
}

// Claim leases tasks of this replica's partitions to the request's workers
// (its slots), waiting up to wait_ms for some, and names each task's worker.
// Gateways send each claim to every replica (ListReplicas), so claims are
// never passed on.
func (s *Server) Claim(ctx context.Context, req *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
	slots := make([]owner.Slot, len(req.GetSlots()))
	for i, sl := range req.GetSlots() {
		slots[i] = owner.Slot{WorkerID: sl.GetWorkerId(), Count: int(sl.GetCount())}
	}
	tasks, err := s.d.Replica.Claim(ctx, owner.ClaimRequest{
		Namespace: req.GetNamespace(),
		Slots:     slots,
		Actions:   req.GetActions(),
		Wait:      millis.Duration(req.GetWaitMs()),
		Lease:     millis.Duration(req.GetLeaseMs()),
		ID:        req.GetClaimId(),
	})
	if err != nil {
		return nil, err
	}
	out := &dispatcherv1.ClaimResponse{Tasks: make([]*flov1.TaskAssignment, len(tasks)), WorkerIds: make([]string, len(tasks))}
	for i, t := range tasks {
		out.Tasks[i] = assignmentProto(t)
		out.WorkerIds[i] = t.Task.WorkerID
	}
	return out, nil
}

// EndClaim ends the wait of a claim this replica holds.
func (s *Server) EndClaim(_ context.Context, req *dispatcherv1.EndClaimRequest) (*dispatcherv1.EndClaimResponse, error) {
	ended, err := s.d.Replica.EndClaim(req.GetClaimId())
	if err != nil {
		return nil, err
	}
	return &dispatcherv1.EndClaimResponse{Ended: ended}, nil
}

// ListReplicas names the replicas that own task partitions.
func (s *Server) ListReplicas(ctx context.Context, _ *dispatcherv1.ListReplicasRequest) (*dispatcherv1.ListReplicasResponse, error) {
	reps, err := s.d.Peers.Replicas(ctx)
	if err != nil {
		return nil, err
	}
	return &dispatcherv1.ListReplicasResponse{Replicas: reps}, nil
}

// Report records how attempts ended, each at the owner of its task's
// partition, the partitions in parallel.
func (s *Server) Report(ctx context.Context, req *dispatcherv1.ReportRequest) (*dispatcherv1.ReportResponse, error) {
	byPart := map[int32][]*dispatcherv1.Report{}
	for _, r := range req.GetReports() {
		p := s.d.Replica.PartitionOf(r.GetTaskId())
		byPart[p] = append(byPart[p], r)
	}
	var (
		mu       sync.Mutex
		rejected []string
		firstErr error
		wg       sync.WaitGroup
	)
	for p, reps := range byPart {
		wg.Go(func() {
			var got []string
			err := s.d.Peers.RoutePartition(ctx, p,
				func(ctx context.Context) error {
					reports := make([]engine.Report, len(reps))
					for i, r := range reps {
						reports[i] = reportDomain(r)
					}
					var err error
					got, err = s.d.Replica.Report(ctx, req.GetNamespace(), reports)
					return err
				},
				func(ctx context.Context, c dispatcherv1.DispatcherClient) error {
					resp, err := c.Report(ctx, &dispatcherv1.ReportRequest{Namespace: req.GetNamespace(), WorkerId: req.GetWorkerId(), Reports: reps})
					got = resp.GetRejectedTaskIds()
					return err
				})
			mu.Lock()
			defer mu.Unlock()
			rejected = append(rejected, got...)
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return &dispatcherv1.ReportResponse{RejectedTaskIds: rejected}, nil
}

// Touch extends a running attempt's lease. An attempt that is not running (or
// a malformed request) is answered with ok=false and the reason, not an RPC
// error, because the worker stream relays it as a TouchAck.
func (s *Server) Touch(ctx context.Context, req *dispatcherv1.TouchRequest) (*flov1.TouchAck, error) {
	var out *flov1.TouchAck
	err := s.d.Peers.Route(ctx, req.GetTaskId(),
		func(ctx context.Context) error {
			until, err := s.d.Replica.Touch(ctx, req.GetNamespace(), req.GetTaskId(), req.GetAttempt(), millis.Duration(req.GetExtendMs()))
			if err != nil {
				msg, ok := touchRefusal(err)
				if !ok {
					return err
				}
				out = &flov1.TouchAck{TaskId: req.GetTaskId(), Ok: false, Error: msg}
				return nil
			}
			out = &flov1.TouchAck{TaskId: req.GetTaskId(), Ok: true, LeaseUntil: timestamp(until)}
			return nil
		},
		func(ctx context.Context, c dispatcherv1.DispatcherClient) error {
			var err error
			out, err = c.Touch(ctx, req)
			return err
		})
	return out, err
}
