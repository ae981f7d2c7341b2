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

// Heartbeat records a worker's load and answers with its status.
func (s *Server) Heartbeat(ctx context.Context, req *flov1.HeartbeatRequest) (*flov1.HeartbeatResponse, error) {
	st, err := s.roster.Heartbeat(ctx, store.Beat{
		Namespace: req.GetNamespace(), ID: req.GetWorkerId(),
		CurrentLoad: req.GetCurrentLoad(), CPULoad: req.GetCpuLoad(), MemoryLoad: req.GetMemoryLoad(),
	})
	if err != nil {
		return nil, err
	}
	return &flov1.HeartbeatResponse{Status: statusProto(st)}, nil
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
