package catalog

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// replaceSchedule makes the new version's schedule the workflow's, or
// removes the schedule when the version has none.
func (c *Catalog) replaceSchedule(ctx context.Context, tx pgx.Tx, namespace string, def *definition.Definition) error {
	s := def.Schedule
	if s == nil {
		return store.DeleteSchedule(ctx, tx, namespace, def.Name)
	}
	now := c.now()
	if err := store.PutSchedule(ctx, tx, scheduleRow(namespace, def, s.First(now)), now); err != nil {
		return err
	}
	return store.NotifySchedules(ctx, tx)
}

func scheduleRow(namespace string, def *definition.Definition, next time.Time) store.Schedule {
	s := def.Schedule
	row := store.Schedule{
		Namespace: namespace, Workflow: def.Name, Version: def.Version, Cron: s.Cron, IntervalMS: s.Interval.Milliseconds(),
		MaxConcurrent: s.MaxConcurrent, Paused: s.Paused, NextFireAt: next,
	}
	if s.Cron != "" {
		row.Timezone = s.Location.String()
	}
	return row
}

// switchSchedule pauses a workflow's schedule with the workflow, or resumes
// it with its next tick after now: the ticks missed while it was off are
// not made up.
func (c *Catalog) switchSchedule(ctx context.Context, tx pgx.Tx, namespace, name string, enabled bool) error {
	row, ok, err := store.GetSchedule(ctx, tx, namespace, name)
	if err != nil || !ok {
		return err
	}
	now := c.now()
	next := row.NextFireAt
	if enabled {
		k := store.VersionKey{Namespace: namespace, Name: name, Version: row.Version}
		defs, err := c.Definitions(ctx, tx, []store.VersionKey{k})
		if err != nil {
			return err
		}
		def, ok := defs[k]
		if !ok || def.Schedule == nil {
			return fmt.Errorf("schedule of workflow %s names version %s, which has none", name, row.Version)
		}
		next = def.Schedule.First(now)
	}
	if err := store.SetScheduleEnabled(ctx, tx, namespace, name, enabled, next, now); err != nil {
		return err
	}
	return store.NotifySchedules(ctx, tx)
}

// Schedules lists a page of a namespace's schedules by workflow name, and
// the token of the next page.
func (c *Catalog) Schedules(ctx context.Context, namespace string, p page.Page) ([]store.Schedule, string, error) {
	if namespace == "" {
		return nil, "", fault.Invalidf("namespace is required")
	}
	after := ""
	if p.After != nil {
		after = p.After[0]
	}
	ss, err := store.ListSchedules(ctx, c.pool, namespace, after, p.Fetch())
	if err != nil {
		return nil, "", err
	}
	ss, next := page.Cut(p, ss, func(s store.Schedule) []string { return []string{s.Workflow} })
	return ss, next, nil
}
