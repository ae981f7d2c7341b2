// Package grpcapi is the registry's gRPC transport: it decodes requests,
// calls the roster and encodes its answers. Domain errors become status codes
// in one place, grpcserver.ErrorInterceptor.
package grpcapi

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/grpcserver"
	"github.com/razorbill/flo/libs/page"
	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/registry/internal/roster"
	"github.com/razorbill/flo/services/registry/internal/store"
)

// Server implements registryv1.RegistryServer.
type Server struct {
	registryv1.UnimplementedRegistryServer
	roster *roster.Roster
}

// NewGRPCServer returns a gRPC server with the Registry service registered,
// refusing calls without auth's internal credential, and the tracing,
// recovery and error-mapping interceptors installed.
func NewGRPCServer(r *roster.Roster, log *slog.Logger, auth config.Auth) (*grpc.Server, error) {
	s, err := grpcserver.NewInternal(auth, log, registryStatus)
	if err != nil {
		return nil, err
	}
	registryv1.RegisterRegistryServer(s, &Server{roster: r})
	return s, nil
}

// registryStatus maps the errors only the registry knows to status codes,
// and returns nil for any other; grpcserver.ErrorInterceptor maps the rest.
// Unavailable tells the SDK to try again later.
func registryStatus(err error) error {
	switch {
	case errors.Is(err, roster.ErrUnavailable):
		return status.Error(codes.Unavailable, roster.ErrUnavailable.Error())
	case errors.Is(err, coalesce.ErrStopped):
		return status.Error(codes.Unavailable, "the worker registry is stopping; retry")
	}
	return nil
}

// RegisterWorker creates or replaces a worker's record.
func (s *Server) RegisterWorker(ctx context.Context, req *flov1.RegisterWorkerRequest) (*flov1.Worker, error) {
	reg := store.Registration{
		Namespace:      req.GetNamespace(),
		ID:             req.GetWorkerId(),
		Type:           workerTypeName(req.GetWorkerType()),
		MaxConcurrency: req.GetMaxConcurrency(),
		MachineID:      req.GetMachineId(),
		Metadata:       req.GetMetadata(),
		Processes:      make([]store.Process, len(req.GetProcesses())),
	}
	for i, p := range req.GetProcesses() {
		reg.Processes[i] = store.Process{Name: p.GetName(), Kind: processKindName(p.GetKind())}
	}
	w, err := s.roster.Register(ctx, reg)
	if err != nil {
		return nil, err
	}
	return workerProto(w), nil
}

// maxHeartbeats caps the heartbeats of one Heartbeats call (a gateway sends
// at most 1,000).
const maxHeartbeats = 10_000

// Heartbeat records a worker's load and answers with its status.
func (s *Server) Heartbeat(ctx context.Context, req *flov1.HeartbeatRequest) (*flov1.HeartbeatResponse, error) {
	st, err := s.roster.Heartbeat(ctx, beatOf(req))
	if err != nil {
		return nil, err
	}
	return &flov1.HeartbeatResponse{Status: statusProto(st)}, nil
}

// Heartbeats records many heartbeats and answers each in order: an unknown
// worker's with unknown, an invalid one with its error. When the database
// could not record them the whole call fails (Unavailable), since the
// heartbeats that were recorded and those that were not are then mixed.
func (s *Server) Heartbeats(ctx context.Context, req *registryv1.HeartbeatsRequest) (*registryv1.HeartbeatsResponse, error) {
	if n := len(req.GetHeartbeats()); n > maxHeartbeats {
		return nil, fault.Invalidf("%d heartbeats in one call, at most %d", n, maxHeartbeats)
	}
	beats := make([]store.Beat, len(req.GetHeartbeats()))
	for i, hb := range req.GetHeartbeats() {
		beats[i] = beatOf(hb)
	}
	statuses, errs := s.roster.Heartbeats(ctx, beats)
	out := &registryv1.HeartbeatsResponse{Acks: make([]*flov1.HeartbeatAck, len(beats))}
	for i, err := range errs {
		ack := &flov1.HeartbeatAck{}
		kind, msg, domain := fault.KindOf(err)
		switch {
		case err == nil:
			ack.Status = statusProto(statuses[i])
		case domain && kind == fault.NotFound:
			ack.Unknown = true
		case domain && kind == fault.Invalid:
			ack.Error = msg
		default:
			return nil, err
		}
		out.Acks[i] = ack
	}
	return out, nil
}

func beatOf(req *flov1.HeartbeatRequest) store.Beat {
	return store.Beat{
		Namespace: req.GetNamespace(), ID: req.GetWorkerId(),
		CurrentLoad: req.GetCurrentLoad(), CPULoad: req.GetCpuLoad(), MemoryLoad: req.GetMemoryLoad(),
	}
}

// GetWorker reads one worker.
func (s *Server) GetWorker(ctx context.Context, req *flov1.GetWorkerRequest) (*flov1.Worker, error) {
	w, err := s.roster.Get(ctx, req.GetNamespace(), req.GetWorkerId())
	if err != nil {
		return nil, err
	}
	return workerProto(w), nil
}

// ListWorkers lists a namespace's workers by id.
func (s *Server) ListWorkers(ctx context.Context, req *flov1.ListWorkersRequest) (*flov1.ListWorkersResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 1)
	if err != nil {
		return nil, err
	}
	ws, next, err := s.roster.List(ctx, req.GetNamespace(), p)
	if err != nil {
		return nil, err
	}
	out := &flov1.ListWorkersResponse{Workers: make([]*flov1.Worker, len(ws)), NextPageToken: next}
	for i, w := range ws {
		out.Workers[i] = workerProto(w)
	}
	return out, nil
}

// DrainWorker marks a worker draining.
func (s *Server) DrainWorker(ctx context.Context, req *flov1.GetWorkerRequest) (*flov1.Worker, error) {
	w, err := s.roster.Drain(ctx, req.GetNamespace(), req.GetWorkerId())
	if err != nil {
		return nil, err
	}
	return workerProto(w), nil
}

// DeregisterWorker removes a worker; removing an unknown one succeeds.
func (s *Server) DeregisterWorker(ctx context.Context, req *flov1.GetWorkerRequest) (*flov1.DeregisterWorkerResponse, error) {
	if err := s.roster.Deregister(ctx, req.GetNamespace(), req.GetWorkerId()); err != nil {
		return nil, err
	}
	return &flov1.DeregisterWorkerResponse{}, nil
}
