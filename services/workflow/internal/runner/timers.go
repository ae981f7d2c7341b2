package runner

import (
	"context"
	"time"

	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// FireTimers advances the runs of up to limit due timers in one transaction
// and reports how many it fired, and whether it left due timers behind
// because another transaction held their runs (retry soon).
func (r *Runner) FireTimers(ctx context.Context, limit int) (fired int, busy bool, err error) {
	err = r.inUnit(ctx, func(u *unit) error {
		fired, busy = 0, false
		due, err := store.DueTimers(ctx, u.tx, u.now, limit)
		if err != nil || len(due) == 0 {
			return err
		}
		ids := make([]string, 0, len(due))
		seen := map[string]bool{}
		for _, t := range due {
			if !seen[t.RunID] {
				seen[t.RunID] = true
				ids = append(ids, t.RunID)
			}
		}
		// Runs another transaction holds are skipped, not waited for: that
		// transaction may be another replica firing the same timers.
		if err := u.lockRuns(ctx, ids, true); err != nil {
			return err
		}
		var mine []store.Timer
		for _, t := range due {
			if u.runs[t.RunID] != nil {
				mine = append(mine, t)
			} else {
				busy = true
			}
		}
		taken, err := store.TakeTimers(ctx, u.tx, mine)
		if err != nil {
			return err
		}
		for _, t := range taken {
			if err := u.advance(ctx, u.runs[t.RunID], engine.TimerFired{Token: t.Token}); err != nil {
				return err
			}
			fired++
		}
		return nil
	})
	return fired, busy, err
}

// NextTimer returns when the earliest timer falls due; ok is false when no
// timer is set.
func (r *Runner) NextTimer(ctx context.Context) (time.Time, bool, error) {
	return store.NextTimer(ctx, r.pool)
}
