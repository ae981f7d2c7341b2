package api

import (
	"context"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/services/gateway/internal/auth"
	"github.com/razorbill/flo/services/gateway/internal/namespace"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// NamespaceServer implements flov1.NamespaceServiceServer.
type NamespaceServer struct {
	flov1.UnimplementedNamespaceServiceServer

	dispatcher dispatcherv1.DispatcherClient
	namespaces *namespace.Cache
	log        *slog.Logger
}

// NewNamespaceServer returns a NamespaceServer backed by the dispatcher.
func NewNamespaceServer(d dispatcherv1.DispatcherClient, namespaces *namespace.Cache, log *slog.Logger) *NamespaceServer {
	return &NamespaceServer{dispatcher: d, namespaces: namespaces, log: log}
}

// CreateNamespace creates a namespace through the dispatcher.
func (s *NamespaceServer) CreateNamespace(ctx context.Context, req *flov1.CreateNamespaceRequest) (*flov1.Namespace, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	ns, err := s.dispatcher.CreateNamespace(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "create namespace", err)
	}
	s.namespaces.Remember(ns.GetName())
	return ns, nil
}

// GetNamespace reads a namespace from the dispatcher.
func (s *NamespaceServer) GetNamespace(ctx context.Context, req *flov1.GetNamespaceRequest) (*flov1.Namespace, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	ns, err := s.dispatcher.GetNamespace(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "get namespace", err)
	}
	s.namespaces.Remember(ns.GetName())
	return ns, nil
}

// ListNamespaces lists namespaces from the dispatcher: all of them for an
// admin, only its own for a key of one namespace.
func (s *NamespaceServer) ListNamespaces(ctx context.Context, req *flov1.ListNamespacesRequest) (*flov1.ListNamespacesResponse, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no authenticated caller")
	}
	if p.Role != auth.RoleAdmin {
		return s.ownNamespace(ctx, req, p.Namespace)
	}
	resp, err := s.dispatcher.ListNamespaces(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "list namespaces", err)
	}
	return resp, nil
}

// ownNamespace is the one page a key of one namespace lists: its namespace,
// when it still exists.
func (s *NamespaceServer) ownNamespace(ctx context.Context, req *flov1.ListNamespacesRequest, name string) (*flov1.ListNamespacesResponse, error) {
	if req.GetPageToken() != "" {
		return &flov1.ListNamespacesResponse{}, nil
	}
	ns, err := s.dispatcher.GetNamespace(ctx, &flov1.GetNamespaceRequest{Name: name})
	if status.Code(err) == codes.NotFound {
		return &flov1.ListNamespacesResponse{}, nil
	}
	if err != nil {
		return nil, upstream(ctx, s.log, "get namespace", err)
	}
	return &flov1.ListNamespacesResponse{Namespaces: []*flov1.Namespace{ns}}, nil
}
