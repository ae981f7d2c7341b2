// Package retry is the one way the platform's infrastructure code waits
// between attempts: reconnecting to Postgres or a service, retrying a log
// batch, a listener or a timer pass that failed. It sits on
// github.com/cenkalti/backoff/v5, which the SDK uses directly (the SDK does
// not depend on the server libs), so a retry policy reads the same everywhere:
// a first delay, a ceiling, jittered doubling in between, and optionally a
// number of tries.
//
// Task and workflow-step retries are not infrastructure: their delays are
// part of the user's policy and come from libs/backoff.
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Jitter is the randomization factor of every policy: each delay is drawn
// from ±20% of the nominal one, so replicas that failed together do not
// retry together.
const Jitter = 0.2

// Policy says how long to wait between attempts.
type Policy struct {
	// Initial is the first delay; it doubles after each failure.
	Initial time.Duration
	// Max caps the delay.
	Max time.Duration
	// Tries bounds the attempts in all, the first included; zero means no
	// bound (until the operation succeeds or ctx ends).
	Tries uint
}

// Backoff returns a fresh delay sequence for p, for loops that run on after a
// success: call NextBackOff after a failure and Reset after a success.
func (p Policy) Backoff() *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.Initial,
		RandomizationFactor: Jitter,
		Multiplier:          2,
		MaxInterval:         p.Max,
	}
	b.Reset()
	return b
}

// Do calls op until it returns nil, returns an error made with Permanent, the
// tries run out or ctx ends, waiting between attempts as p says. notify, when
// not nil, sees each failure that is followed by a wait, with the attempt's
// number and the wait. Do returns nil, op's last error (unwrapped from
// Permanent), or ctx's error when ctx ended first.
func Do(ctx context.Context, p Policy, op func() error, notify func(err error, attempt int, next time.Duration)) error {
	attempt := 0
	opts := []backoff.RetryOption{
		backoff.WithBackOff(p.Backoff()),
		backoff.WithMaxElapsedTime(0),
		backoff.WithMaxTries(p.Tries),
	}
	if notify != nil {
		opts = append(opts, backoff.WithNotify(func(err error, next time.Duration) { notify(err, attempt, next) }))
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		attempt++
		return struct{}{}, op()
	}, opts...)
	return err
}

// Permanent marks err as one that another attempt cannot fix: Do returns it
// at once.
func Permanent(err error) error { return backoff.Permanent(err) }

// Sleep waits d or until ctx ends, reporting whether the whole wait passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
