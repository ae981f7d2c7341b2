// Package timer fires the workflow service's durable timers (retry delays,
// poll delays, signal timeouts). Every replica runs a Loop; due timers are
// taken in batches, each in one transaction, and a replica skips runs another
// one is firing. A Loop sleeps until its next timer and is woken early when
// this replica sets a sooner one (Wake), when another replica announces one
// (Postgres NOTIFY, through a Listener), and at least every safety tick,
// which also catches whatever a missed wake-up left behind.
package timer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/razorbill/flo/libs/retry"
)

// Batch is how many timers one transaction fires at most.
const Batch = 256

const (
	// busyRetry is how soon a loop looks again at due timers whose runs
	// another transaction held.
	busyRetry = 50 * time.Millisecond
	// minWait keeps a loop from spinning when a timer is due but was not
	// there to fire (another replica took it meanwhile).
	minWait = 5 * time.Millisecond
)

// failRetry is how the loop waits after a pass that failed.
var failRetry = retry.Policy{Initial: busyRetry, Max: 5 * time.Second}

// delays is the sequence of waits after failures that pass draws from
// (failRetry.Backoff()).
type delays interface {
	NextBackOff() time.Duration
	Reset()
}

// Firer fires due timers and finds the next one.
type Firer interface {
	// FireTimers fires up to limit due timers; busy reports due timers left
	// because their runs were locked.
	FireTimers(ctx context.Context, limit int) (fired int, busy bool, err error)
	// NextTimer returns when the earliest timer falls due.
	NextTimer(ctx context.Context) (at time.Time, ok bool, err error)
}

// Loop fires timers as they fall due.
type Loop struct {
	f    Firer
	tick time.Duration
	log  *slog.Logger
	wake chan struct{}

	mu sync.Mutex
	// sleepUntil is when the loop will look next; while it works it is far
	// in the future, so every wake-up counts.
	sleepUntil time.Time
}

// farFuture stands for "awake": any timer is sooner.
var farFuture = time.Unix(1<<62, 0)

// NewLoop returns a loop firing through f that looks at least every tick.
func NewLoop(f Firer, tick time.Duration, log *slog.Logger) *Loop {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Loop{f: f, tick: tick, log: log, wake: make(chan struct{}, 1), sleepUntil: farFuture}
}

// Wake tells the loop a timer was set to fire at at; it wakes when it would
// sleep past that. It never blocks.
func (l *Loop) Wake(at time.Time) {
	l.mu.Lock()
	sooner := at.Before(l.sleepUntil)
	l.mu.Unlock()
	if sooner {
		l.WakeNow()
	}
}

// WakeNow makes the loop look at once.
func (l *Loop) WakeNow() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Run fires timers until ctx ends and returns nil then.
func (l *Loop) Run(ctx context.Context) error {
	b := failRetry.Backoff()
	sleep := time.NewTimer(time.Hour)
	defer sleep.Stop()
	for {
		l.setSleepUntil(farFuture)
		wait, full := l.pass(ctx, b)
		if ctx.Err() != nil {
			return nil
		}
		if full {
			continue
		}
		l.setSleepUntil(time.Now().Add(wait))
		sleep.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-sleep.C:
		case <-l.wake:
			if !sleep.Stop() {
				select {
				case <-sleep.C:
				default:
				}
			}
		}
	}
}

// pass fires one batch and decides how long to sleep, drawing the wait after
// a failure from b; full reports a full batch, after which the loop goes on
// at once.
func (l *Loop) pass(ctx context.Context, b delays) (wait time.Duration, full bool) {
	fired, busy, err := l.f.FireTimers(ctx, Batch)
	if err != nil {
		wait = b.NextBackOff()
		if ctx.Err() == nil {
			l.log.WarnContext(ctx, "fire timers failed; retrying", "retry_in", wait, "error", err)
		}
		return wait, false
	}
	b.Reset()
	if fired == Batch {
		return 0, true
	}
	wait = l.tick
	next, ok, err := l.f.NextTimer(ctx)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			l.log.WarnContext(ctx, "find next timer failed", "error", err)
		}
	case ok:
		wait = min(wait, max(time.Until(next), minWait))
	}
	if busy {
		wait = min(wait, busyRetry)
	}
	return wait, false
}

func (l *Loop) setSleepUntil(t time.Time) {
	l.mu.Lock()
	l.sleepUntil = t
	l.mu.Unlock()
}
