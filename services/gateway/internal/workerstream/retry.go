package workerstream

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	// Named apart from this package's retry function, which its callers
	// use all over the package.
	backoffretry "github.com/razorbill/flo/libs/retry"
)

// permanent reports whether retrying a dispatcher call that failed with err
// cannot help: the request itself is wrong. Everything else (the dispatcher
// restarting, a database hiccup) is worth retrying; reports, claims and
// touches are idempotent per task id and attempt.
func permanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated:
		return true
	}
	return false
}

// dispatcherRetry is how calls to the dispatcher and the streams service
// wait between attempts.
var dispatcherRetry = backoffretry.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}

// retry runs op until it succeeds, fails permanently or ctx ends, backing off
// between attempts. It returns op's last error.
func retry(ctx context.Context, op func(context.Context) error) error {
	var last error
	_ = backoffretry.Do(ctx, dispatcherRetry, func() error {
		last = op(ctx)
		if last != nil && permanent(last) {
			return backoffretry.Permanent(last)
		}
		return last
	}, nil)
	return last
}
