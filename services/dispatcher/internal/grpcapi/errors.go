package grpcapi

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/owner"
)

// dispatcherStatus maps the errors only the dispatcher knows to status
// codes, and returns nil for any other; grpcserver.ErrorInterceptor maps the
// rest.
func dispatcherStatus(err error) error {
	switch {
	case errors.Is(err, owner.ErrNotOwner):
		// A forwarding replica reads ABORTED as "ask the owner again".
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, owner.ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	}
	return nil
}

// touchRefusal says whether a Touch error is a refusal to answer with
// ok=false (rather than an RPC error), and its message.
func touchRefusal(err error) (string, bool) {
	if errors.Is(err, engine.ErrNotRunning) {
		return err.Error(), true
	}
	if kind, msg, ok := fault.KindOf(err); ok && kind == fault.Invalid {
		return msg, true
	}
	return "", false
}
