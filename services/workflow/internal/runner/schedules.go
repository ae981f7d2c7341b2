package runner

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// unreadableScheduleRetry is how long a schedule whose definition cannot be
// read waits before it is tried again, so it never holds up the others.
const unreadableScheduleRetry = time.Minute

// FireSchedules takes up to limit schedules due at now, locked so that no
// other replica takes them, and for each starts a run (input and version
// the schedule's) or, when max_concurrent of its runs are still going,
// records a skipped tick. The runs, the ticks and each schedule's next fire
// time commit in one transaction, so a tick starts exactly one run however
// many replicas look and wherever one crashes. The next fire time is the
// schedule's first tick after now: after downtime the ticks missed are not
// made up, beyond the one due tick that fires now.
func (r *Runner) FireSchedules(ctx context.Context, now time.Time, limit int) (int, error) {
	var n, fired int
	err := r.inUnit(ctx, func(u *unit) error {
		fired = 0
		due, err := store.LockDueSchedules(ctx, u.tx, now, limit)
		n = len(due)
		if err != nil || n == 0 {
			return err
		}
		names := make([]store.NameKey, n)
		versions := make([]store.VersionKey, n)
		for i, s := range due {
			names[i] = store.NameKey{Namespace: s.Namespace, Name: s.Workflow}
			versions[i] = store.VersionKey{Namespace: s.Namespace, Name: s.Workflow, Version: s.Version}
		}
		running, err := store.ScheduledRunning(ctx, u.tx, names)
		if err != nil {
			return err
		}
		defs, err := r.catalog.Definitions(ctx, u.tx, versions)
		if err != nil {
			return err
		}
		ticks := make([]store.Tick, n)
		for i, s := range due {
			ticks[i] = store.Tick{Namespace: s.Namespace, Workflow: s.Workflow, At: s.NextFireAt}
			def := defs[versions[i]]
			if def == nil || def.Schedule == nil {
				r.log.ErrorContext(ctx, "schedule names a version without one; trying again later",
					"namespace", s.Namespace, "workflow", s.Workflow, "version", s.Version)
				ticks[i].Next = now.Add(unreadableScheduleRetry)
				continue
			}
			ticks[i].Next = def.Schedule.Next(s.NextFireAt, now)
			if running[names[i]] >= s.MaxConcurrent {
				r.log.InfoContext(ctx, "schedule tick skipped: max_concurrent runs still going",
					"namespace", s.Namespace, "workflow", s.Workflow, "tick", s.NextFireAt, "max_concurrent", s.MaxConcurrent)
				continue
			}
			run := &store.Run{Run: engine.Run{
				ID: newRunID(), Namespace: s.Namespace, Workflow: s.Workflow, Version: s.Version,
				Status: engine.StatusPending, Input: def.Schedule.Input, CreatedAt: u.now, UpdatedAt: u.now,
				ScheduledFor: s.NextFireAt,
			}}
			e := u.add(run, true)
			e.def = def
			u.pending[run.ID] = nil
			run.HistorySeq++
			u.history = append(u.history, store.HistoryRow{RunID: run.ID, Seq: run.HistorySeq, HistoryEvent: engine.HistoryEvent{
				Type: engine.HistoryScheduleFired, Detail: s.NextFireAt.UTC().Format(time.RFC3339Nano), At: u.now,
			}})
			if err := u.advance(ctx, e, engine.Started{}); err != nil {
				return err
			}
			ticks[i].RunID = run.ID
			fired++
			r.log.DebugContext(ctx, "schedule fired", "namespace", s.Namespace, "workflow", s.Workflow, "tick", s.NextFireAt, "run_id", run.ID)
		}
		return store.RecordTicks(ctx, u.tx, ticks)
	})
	if err != nil {
		return 0, err
	}
	r.scheduleTicks.Add(ctx, int64(fired), metric.WithAttributes(attribute.String("result", "fired")))
	r.scheduleTicks.Add(ctx, int64(n-fired), metric.WithAttributes(attribute.String("result", "skipped")))
	return n, nil
}

// NextSchedule returns the earliest next fire time of the active
// schedules.
func (r *Runner) NextSchedule(ctx context.Context) (time.Time, bool, error) {
	return store.NextScheduleAt(ctx, r.pool)
}
