package probe

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Check is one condition of readiness: nil when it holds, else why not.
type Check func(ctx context.Context) error

// All is ready when every check holds; the first that does not says why.
func All(checks ...Check) func(context.Context) error {
	return func(ctx context.Context) error {
		for _, c := range checks {
			if err := c(ctx); err != nil {
				return err
			}
		}
		return nil
	}
}

// Unset holds while flag is not set (a service that is stopping sets its
// flag first, so readiness goes false before anything stops).
func Unset(flag *atomic.Bool, reason string) Check {
	return func(context.Context) error {
		if flag.Load() {
			return errors.New(reason)
		}
		return nil
	}
}

// Set holds while flag is set (a consumer's flag, say, set while it runs).
func Set(flag *atomic.Bool, reason string) Check {
	return func(context.Context) error {
		if !flag.Load() {
			return errors.New(reason)
		}
		return nil
	}
}

// Pinger is what Ping checks: a database pool, say.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Ping holds when p answers within timeout; name says what p is.
func Ping(name string, p Pinger, timeout time.Duration) Check {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := p.Ping(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
}
