// Package schedule runs workflow schedules: every replica runs a Loop that
// sleeps until the earliest next fire time of all schedules (kept durably in
// Postgres), then has the runner take the due ones under row locks that
// other replicas skip. A schedule created or resumed on any replica wakes
// every Loop (Postgres NOTIFY); a safety tick catches a missed wake-up.
//
// The Loop is the timer loop (package timer) firing schedules instead of
// timers, on a clock that tests can replace: schedule times are read on
// that clock and slept on the real one.
package schedule

import (
	"context"
	"log/slog"
	"time"

	"github.com/razorbill/flo/services/workflow/internal/timer"
)

// Starter fires due schedules and finds the next one (the runner).
type Starter interface {
	// FireSchedules starts the runs of up to limit schedules due at now.
	FireSchedules(ctx context.Context, now time.Time, limit int) (int, error)
	// NextSchedule returns the earliest next fire time.
	NextSchedule(ctx context.Context) (time.Time, bool, error)
}

// NewLoop returns a loop firing s's schedules as they fall due on the clock
// now, looking at least every tick. Its log lines (the timer loop's words)
// carry loop=schedules.
func NewLoop(s Starter, now func() time.Time, tick time.Duration, log *slog.Logger) *timer.Loop {
	if log != nil {
		log = log.With("loop", "schedules")
	}
	return timer.NewLoop(firer{s: s, now: now}, tick, log)
}

// firer adapts a Starter to the timer loop.
type firer struct {
	s   Starter
	now func() time.Time
}

// FireTimers fires due schedules; a schedule another replica holds is
// firing there, so none is ever busy here.
func (f firer) FireTimers(ctx context.Context, limit int) (int, bool, error) {
	n, err := f.s.FireSchedules(ctx, f.now(), limit)
	return n, false, err
}

// NextTimer is the next fire time moved from the schedule clock to the real
// one, which the loop sleeps on.
func (f firer) NextTimer(ctx context.Context) (time.Time, bool, error) {
	at, ok, err := f.s.NextSchedule(ctx)
	if err != nil || !ok {
		return time.Time{}, ok, err
	}
	return time.Now().Add(at.Sub(f.now())), true, nil
}
