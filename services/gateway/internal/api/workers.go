package api

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/services/gateway/internal/namespace"

	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// WorkerServer implements flov1.WorkerRegistryServiceServer by forwarding to
// the registry, which owns worker records and validates everything about
// them; its status codes reach the caller unchanged. The gateway checks the
// namespace, as for every call, and applies a drain to the worker streams it
// serves itself as soon as the registry has recorded it, so a drain asked
// through this gateway takes effect here before the call returns instead of
// when the worker event comes back from the log.
type WorkerServer struct {
	flov1.UnimplementedWorkerRegistryServiceServer

	registry   registryv1.RegistryClient
	namespaces *namespace.Cache
	onDrain    func(namespace, workerID string)
	log        *slog.Logger
}

// NewWorkerServer returns a WorkerServer backed by the registry. onDrain is
// called with a worker the registry reports draining (after DrainWorker, or
// in a heartbeat's answer); it must be cheap and idempotent.
func NewWorkerServer(r registryv1.RegistryClient, namespaces *namespace.Cache, onDrain func(namespace, workerID string), log *slog.Logger) *WorkerServer {
	return &WorkerServer{registry: r, namespaces: namespaces, onDrain: onDrain, log: log}
}

// RegisterWorker creates or replaces a worker's record.
func (s *WorkerServer) RegisterWorker(ctx context.Context, req *flov1.RegisterWorkerRequest) (*flov1.Worker, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	w, err := s.registry.RegisterWorker(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "register worker", err)
	}
	return w, nil
}

// Heartbeat records a worker's load and answers with its status.
func (s *WorkerServer) Heartbeat(ctx context.Context, req *flov1.HeartbeatRequest) (*flov1.HeartbeatResponse, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	resp, err := s.registry.Heartbeat(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "heartbeat", err)
	}
	if resp.GetStatus() == flov1.WorkerStatus_WORKER_STATUS_DRAINING {
		s.onDrain(req.GetNamespace(), req.GetWorkerId())
	}
	return resp, nil
}

// GetWorker reads one worker's record.
func (s *WorkerServer) GetWorker(ctx context.Context, req *flov1.GetWorkerRequest) (*flov1.Worker, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	w, err := s.registry.GetWorker(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "get worker", err)
	}
	return w, nil
}

// ListWorkers lists a namespace's workers.
func (s *WorkerServer) ListWorkers(ctx context.Context, req *flov1.ListWorkersRequest) (*flov1.ListWorkersResponse, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	resp, err := s.registry.ListWorkers(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "list workers", err)
	}
	return resp, nil
}

// DrainWorker marks a worker draining and stops handing it tasks on this
// gateway's streams at once.
func (s *WorkerServer) DrainWorker(ctx context.Context, req *flov1.GetWorkerRequest) (*flov1.Worker, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	w, err := s.registry.DrainWorker(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "drain worker", err)
	}
	s.onDrain(req.GetNamespace(), req.GetWorkerId())
	return w, nil
}

// DeregisterWorker removes a worker's record; removing an unknown worker
// succeeds.
func (s *WorkerServer) DeregisterWorker(ctx context.Context, req *flov1.GetWorkerRequest) (*flov1.DeregisterWorkerResponse, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	resp, err := s.registry.DeregisterWorker(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "deregister worker", err)
	}
	return resp, nil
}

// NoRegistry stands in for the registry when a gateway is configured
// without one: every call fails with Unavailable, exactly as when the
// registry is down, so workers run unregistered.
var NoRegistry registryv1.RegistryClient = noRegistry{}

type noRegistry struct{}

var errNoRegistry = status.Error(codes.Unavailable, "no worker registry is configured (FLO_REGISTRY_ADDR)")

func (noRegistry) RegisterWorker(context.Context, *flov1.RegisterWorkerRequest, ...grpc.CallOption) (*flov1.Worker, error) {
	return nil, errNoRegistry
}

func (noRegistry) Heartbeat(context.Context, *flov1.HeartbeatRequest, ...grpc.CallOption) (*flov1.HeartbeatResponse, error) {
	return nil, errNoRegistry
}

func (noRegistry) Heartbeats(context.Context, *registryv1.HeartbeatsRequest, ...grpc.CallOption) (*registryv1.HeartbeatsResponse, error) {
	return nil, errNoRegistry
}

func (noRegistry) GetWorker(context.Context, *flov1.GetWorkerRequest, ...grpc.CallOption) (*flov1.Worker, error) {
	return nil, errNoRegistry
}

func (noRegistry) ListWorkers(context.Context, *flov1.ListWorkersRequest, ...grpc.CallOption) (*flov1.ListWorkersResponse, error) {
	return nil, errNoRegistry
}

func (noRegistry) DrainWorker(context.Context, *flov1.GetWorkerRequest, ...grpc.CallOption) (*flov1.Worker, error) {
	return nil, errNoRegistry
}

func (noRegistry) DeregisterWorker(context.Context, *flov1.GetWorkerRequest, ...grpc.CallOption) (*flov1.DeregisterWorkerResponse, error) {
	return nil, errNoRegistry
}
