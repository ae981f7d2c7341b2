package api

import (
	"context"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/services/gateway/internal/action"
	"github.com/razorbill/flo/services/gateway/internal/namespace"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// ActionServer implements flov1.ActionServiceServer. The dispatcher owns
// actions and validates their settings (timeouts, attempts, backoff).
type ActionServer struct {
	flov1.UnimplementedActionServiceServer

	dispatcher dispatcherv1.DispatcherClient
	namespaces *namespace.Cache
	actions    *action.Cache
	log        *slog.Logger
}

// NewActionServer returns an ActionServer backed by the dispatcher.
func NewActionServer(d dispatcherv1.DispatcherClient, namespaces *namespace.Cache, actions *action.Cache, log *slog.Logger) *ActionServer {
	return &ActionServer{dispatcher: d, namespaces: namespaces, actions: actions, log: log}
}

// RegisterAction creates or updates an action.
func (s *ActionServer) RegisterAction(ctx context.Context, req *flov1.RegisterActionRequest) (*flov1.Action, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	a, err := s.dispatcher.RegisterAction(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "register action", err)
	}
	s.actions.Forget(req.GetNamespace(), req.GetName())
	return a, nil
}

// GetAction reads one action.
func (s *ActionServer) GetAction(ctx context.Context, req *flov1.GetActionRequest) (*flov1.Action, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	a, err := s.dispatcher.GetAction(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "get action", err)
	}
	return a, nil
}

// ListActions lists a namespace's actions.
func (s *ActionServer) ListActions(ctx context.Context, req *flov1.ListActionsRequest) (*flov1.ListActionsResponse, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	resp, err := s.dispatcher.ListActions(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "list actions", err)
	}
	return resp, nil
}

// EnableAction lets an action be invoked again.
func (s *ActionServer) EnableAction(ctx context.Context, req *flov1.GetActionRequest) (*flov1.Action, error) {
	return s.setEnabled(ctx, req, true)
}

// DisableAction makes new invocations of an action fail with
// FailedPrecondition.
func (s *ActionServer) DisableAction(ctx context.Context, req *flov1.GetActionRequest) (*flov1.Action, error) {
	return s.setEnabled(ctx, req, false)
}

func (s *ActionServer) setEnabled(ctx context.Context, req *flov1.GetActionRequest, enabled bool) (*flov1.Action, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	a, err := s.dispatcher.SetActionEnabled(ctx, &dispatcherv1.SetActionEnabledRequest{
		Namespace: req.GetNamespace(), Name: req.GetName(), Enabled: enabled,
	})
	if err != nil {
		return nil, upstream(ctx, s.log, "set action enabled", err)
	}
	s.actions.Forget(req.GetNamespace(), req.GetName())
	return a, nil
}
