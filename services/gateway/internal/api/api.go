// Package api implements the public gRPC services NamespaceService,
// ActionService, TaskService and WorkerRegistryService. Handlers are thin:
// they validate what the gateway can judge alone (names, sizes, the namespace
// existing), then either pass the call to the dispatcher or the registry,
// whose status codes reach the caller unchanged, or put an invocation on the
// log. The REST facade serves the same
// handlers in process through grpc-gateway.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/gateway/internal/action"
	"github.com/razorbill/flo/services/gateway/internal/namespace"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// NamespaceLookup returns the namespace cache's lookup, asking the dispatcher.
func NamespaceLookup(d dispatcherv1.DispatcherClient) namespace.LookupFunc {
	return func(ctx context.Context, name string) error {
		_, err := d.GetNamespace(ctx, &flov1.GetNamespaceRequest{Name: name})
		if status.Code(err) == codes.NotFound {
			return namespace.ErrNotFound
		}
		return err
	}
}

// ActionLookup returns the action cache's lookup, asking the dispatcher.
func ActionLookup(d dispatcherv1.DispatcherClient) action.LookupFunc {
	return func(ctx context.Context, ns, name string) (bool, error) {
		a, err := d.GetAction(ctx, &flov1.GetActionRequest{Namespace: ns, Name: name})
		if status.Code(err) == codes.NotFound {
			return false, action.ErrNotFound
		}
		if err != nil {
			return false, err
		}
		return a.GetEnabled(), nil
	}
}

// CheckNamespace checks that a call's namespace exists and maps the answer to
// a gRPC status: InvalidArgument when empty or malformed, NotFound when
// unknown.
func CheckNamespace(ctx context.Context, log *slog.Logger, namespaces *namespace.Cache, name string) error {
	if name != "" {
		if err := text.Name("namespace", name); err != nil {
			return Invalid(err)
		}
	}
	err := namespaces.Check(ctx, name)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, namespace.ErrEmpty):
		return status.Error(codes.InvalidArgument, "namespace is required")
	case errors.Is(err, namespace.ErrNotFound):
		return status.Errorf(codes.NotFound, "namespace %q not found", name)
	default:
		return upstream(ctx, log, "check namespace", err)
	}
}

// Invalid returns the InvalidArgument status of a libs/text rule's error,
// whose message names the field.
func Invalid(err error) error {
	return status.Error(codes.InvalidArgument, err.Error())
}

// checkTaskID rejects ids that cannot name a task before they reach the
// dispatcher; task ids are UUIDs.
func checkTaskID(id string) error {
	if id == "" {
		return status.Error(codes.InvalidArgument, "task_id is required")
	}
	if _, err := uuid.Parse(id); err != nil {
		return status.Errorf(codes.InvalidArgument, "task_id %q is not a UUID", id)
	}
	return nil
}

// upstream returns the gRPC status an error from the dispatcher, the registry
// or the log
// carries, so callers see the dispatcher's codes and messages unchanged. An
// error without a status is logged with what was being done and becomes
// Internal (or Canceled/DeadlineExceeded when the caller's context ended).
func upstream(ctx context.Context, log *slog.Logger, doing string, err error) error {
	var gs interface{ GRPCStatus() *status.Status }
	if errors.As(err, &gs) {
		return gs.GRPCStatus().Err()
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	log.ErrorContext(ctx, doing+" failed", slog.Any("error", err))
	return status.Error(codes.Internal, fmt.Sprintf("%s failed", doing))
}
