package workerstream

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// retry runs op until it succeeds, fails permanently or ctx ends, backing off
// between attempts. It returns op's last error.
func retry(ctx context.Context, op func(context.Context) error) error {
	var b backoff
	for {
		err := op(ctx)
		if err == nil || permanent(err) || ctx.Err() != nil {
			return err
		}
		if !sleep(ctx, b.next()) {
			return err
		}
	}
}

// backoff yields exponentially growing, jittered delays from 50 ms to 2 s.
type backoff struct{ d time.Duration }

func (b *backoff) next() time.Duration {
	const first, ceiling = 50 * time.Millisecond, 2 * time.Second
	if b.d == 0 {
		b.d = first
	} else {
		b.d = min(2*b.d, ceiling)
	}
	return b.d/2 + rand.N(b.d/2+1)
}

func (b *backoff) reset() { b.d = 0 }

// sleep waits d or until ctx ends, reporting whether the full wait happened.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
