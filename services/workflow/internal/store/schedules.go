package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// SchedulesChannel is the Postgres NOTIFY channel telling every replica that
// a schedule was created or resumed, so a scheduler sleeping past its first
// tick looks again.
const SchedulesChannel = "flo_workflow_schedules"

// The states of a schedule.
const (
	ScheduleActive   = "active"
	SchedulePaused   = "paused"
	ScheduleDisabled = "disabled"
)

// Schedule is a row of schedules: a workflow's schedule, the version that
// owns it, and its durable progress.
type Schedule struct {
	Namespace, Workflow, Version string
	// Cron and Timezone, or IntervalMS, as the definition wrote them.
	Cron, Timezone string
	IntervalMS     int64
	MaxConcurrent  int
	// Paused is the definition's paused; Enabled the workflow's switch.
	Paused, Enabled bool
	NextFireAt      time.Time
	// LastFireAt is the tick of the last run started; zero before the first.
	LastFireAt    time.Time
	LastRunID     string
	Fired         int64
	Skipped       int64
	LastSkippedAt time.Time
}

// State is disabled (the workflow is), paused (by its definition) or
// active.
func (s Schedule) State() string {
	switch {
	case !s.Enabled:
		return ScheduleDisabled
	case s.Paused:
		return SchedulePaused
	}
	return ScheduleActive
}

const scheduleColumns = `namespace, workflow, version, cron, timezone, interval_ms, max_concurrent, paused, enabled,
	next_fire_at, last_fire_at, coalesce(last_run_id::text, ''), fired, skipped, last_skipped_at`

func scanSchedules(rows pgx.Rows) ([]Schedule, error) {
	defer rows.Close()
	var out []Schedule
	for rows.Next() {
		var (
			s                Schedule
			lastFire, lastSk pgtype.Timestamptz
		)
		if err := rows.Scan(&s.Namespace, &s.Workflow, &s.Version, &s.Cron, &s.Timezone, &s.IntervalMS, &s.MaxConcurrent,
			&s.Paused, &s.Enabled, &s.NextFireAt, &lastFire, &s.LastRunID, &s.Fired, &s.Skipped, &lastSk); err != nil {
			return nil, err
		}
		s.LastFireAt, s.LastSkippedAt = lastFire.Time, lastSk.Time
		out = append(out, s)
	}
	return out, rows.Err()
}

// PutSchedule makes s the schedule of its workflow, replacing the one an
// older version wrote; the progress (last run, counts) is kept. enabled
// comes from the workflow's switch. Run it in the transaction that creates
// the version.
func PutSchedule(ctx context.Context, db DB, s Schedule, now time.Time) error {
	if _, err := db.Exec(ctx, `
INSERT INTO schedules (namespace, workflow, version, cron, timezone, interval_ms, max_concurrent, paused, enabled, next_fire_at, updated_at)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, w.enabled, $9, $10 FROM workflows w WHERE w.namespace = $1 AND w.name = $2
ON CONFLICT (namespace, workflow) DO UPDATE SET version = excluded.version, cron = excluded.cron, timezone = excluded.timezone,
	interval_ms = excluded.interval_ms, max_concurrent = excluded.max_concurrent, paused = excluded.paused,
	next_fire_at = excluded.next_fire_at, updated_at = excluded.updated_at`,
		s.Namespace, s.Workflow, s.Version, s.Cron, s.Timezone, s.IntervalMS, s.MaxConcurrent, s.Paused, s.NextFireAt, now); err != nil {
		return fmt.Errorf("put schedule of workflow %s: %w", s.Workflow, err)
	}
	return nil
}

// DeleteSchedule removes a workflow's schedule, if it has one, and forgets
// the runs it started (they go on; a later schedule does not count them).
func DeleteSchedule(ctx context.Context, db DB, namespace, workflow string) error {
	b := &pgx.Batch{}
	b.Queue(`DELETE FROM schedules WHERE namespace = $1 AND workflow = $2`, namespace, workflow)
	b.Queue(`DELETE FROM schedule_runs WHERE namespace = $1 AND workflow = $2`, namespace, workflow)
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("delete schedule of workflow %s: %w", workflow, err)
	}
	return nil
}

// GetSchedule reads and locks a workflow's schedule; ok is false when it
// has none.
func GetSchedule(ctx context.Context, db DB, namespace, workflow string) (_ Schedule, ok bool, err error) {
	rows, err := db.Query(ctx, `SELECT `+scheduleColumns+` FROM schedules WHERE namespace = $1 AND workflow = $2 FOR UPDATE`, namespace, workflow)
	if err != nil {
		return Schedule{}, false, fmt.Errorf("get schedule of workflow %s: %w", workflow, err)
	}
	ss, err := scanSchedules(rows)
	if err != nil || len(ss) == 0 {
		return Schedule{}, false, err
	}
	return ss[0], true, nil
}

// SetScheduleEnabled follows the workflow's switch; next is the next fire
// time (resuming counts from now, not from the ticks missed while off).
func SetScheduleEnabled(ctx context.Context, db DB, namespace, workflow string, enabled bool, next, now time.Time) error {
	if _, err := db.Exec(ctx, `
UPDATE schedules SET enabled = $3, next_fire_at = $4, updated_at = $5 WHERE namespace = $1 AND workflow = $2`,
		namespace, workflow, enabled, next, now); err != nil {
		return fmt.Errorf("switch schedule of workflow %s: %w", workflow, err)
	}
	return nil
}

// ListSchedules lists up to limit schedules of a namespace, by workflow,
// after the workflow named after.
func ListSchedules(ctx context.Context, db DB, namespace, after string, limit int) ([]Schedule, error) {
	rows, err := db.Query(ctx, `SELECT `+scheduleColumns+` FROM schedules WHERE namespace = $1 AND workflow > $2 ORDER BY workflow LIMIT $3`,
		namespace, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	ss, err := scanSchedules(rows)
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	return ss, nil
}

// LockDueSchedules locks up to limit active schedules due at now, skipping
// those another transaction holds: that one is firing them.
func LockDueSchedules(ctx context.Context, db DB, now time.Time, limit int) ([]Schedule, error) {
	rows, err := db.Query(ctx, `
SELECT `+scheduleColumns+` FROM schedules WHERE enabled AND NOT paused AND next_fire_at <= $1
ORDER BY next_fire_at LIMIT $2 FOR UPDATE SKIP LOCKED`, now, limit)
	if err != nil {
		return nil, fmt.Errorf("lock due schedules: %w", err)
	}
	ss, err := scanSchedules(rows)
	if err != nil {
		return nil, fmt.Errorf("lock due schedules: %w", err)
	}
	return ss, nil
}

// NextScheduleAt returns the earliest next fire time of active schedules.
func NextScheduleAt(ctx context.Context, db DB) (time.Time, bool, error) {
	var at pgtype.Timestamptz
	if err := db.QueryRow(ctx, `SELECT min(next_fire_at) FROM schedules WHERE enabled AND NOT paused`).Scan(&at); err != nil {
		return time.Time{}, false, fmt.Errorf("find next schedule: %w", err)
	}
	return at.Time, at.Valid, nil
}

// ScheduledRunning forgets the scheduled runs of the given workflows that
// have ended and counts those still going.
func ScheduledRunning(ctx context.Context, db DB, keys []NameKey) (map[NameKey]int, error) {
	namespaces, names := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		namespaces[i], names[i] = k.Namespace, k.Name
	}
	rows, err := db.Query(ctx, `
WITH mine AS (
	SELECT s.run_id, s.namespace, s.workflow, r.finished_at IS NOT NULL AS ended FROM schedule_runs s JOIN runs r ON r.id = s.run_id
	WHERE (s.namespace, s.workflow) IN (SELECT * FROM unnest($1::text[], $2::text[]))
), gone AS (
	DELETE FROM schedule_runs WHERE run_id IN (SELECT run_id FROM mine WHERE ended)
)
SELECT namespace, workflow, count(*) FROM mine WHERE NOT ended GROUP BY namespace, workflow`, namespaces, names)
	if err != nil {
		return nil, fmt.Errorf("count scheduled runs: %w", err)
	}
	defer rows.Close()
	out := map[NameKey]int{}
	for rows.Next() {
		var (
			k NameKey
			n int
		)
		if err := rows.Scan(&k.Namespace, &k.Name, &n); err != nil {
			return nil, fmt.Errorf("count scheduled runs: %w", err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count scheduled runs: %w", err)
	}
	return out, nil
}

// Tick is what became of one due schedule: a run started (RunID set) or a
// skipped tick, and its next fire time.
type Tick struct {
	Namespace, Workflow string
	At                  time.Time
	RunID               string
	Next                time.Time
}

// RecordTicks moves fired schedules on and remembers the runs they started.
func RecordTicks(ctx context.Context, db DB, ticks []Tick) error {
	n := len(ticks)
	namespaces, workflows, runIDs := make([]string, n), make([]string, n), make([]string, n)
	at, next := make([]time.Time, n), make([]time.Time, n)
	for i, t := range ticks {
		namespaces[i], workflows[i], runIDs[i], at[i], next[i] = t.Namespace, t.Workflow, t.RunID, t.At, t.Next
	}
	b := &pgx.Batch{}
	b.Queue(`
UPDATE schedules s SET next_fire_at = t.next, updated_at = now(),
	last_fire_at = CASE WHEN t.run = '' THEN s.last_fire_at ELSE t.at END,
	last_run_id = CASE WHEN t.run = '' THEN s.last_run_id ELSE t.run::uuid END,
	fired = s.fired + (t.run <> '')::int, skipped = s.skipped + (t.run = '')::int,
	last_skipped_at = CASE WHEN t.run = '' THEN t.at ELSE s.last_skipped_at END
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::timestamptz[]) AS t(namespace, workflow, run, at, next)
WHERE s.namespace = t.namespace AND s.workflow = t.workflow`, namespaces, workflows, runIDs, at, next)
	b.Queue(`
INSERT INTO schedule_runs (run_id, namespace, workflow, tick)
SELECT t.run::uuid, t.namespace, t.workflow, t.at
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[]) AS t(namespace, workflow, run, at) WHERE t.run <> ''`,
		namespaces, workflows, runIDs, at)
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("record %d schedule ticks: %w", n, err)
	}
	return nil
}

// NotifySchedules tells every replica's scheduler, when the transaction
// commits, to look at the schedules again.
func NotifySchedules(ctx context.Context, db DB) error {
	if _, err := db.Exec(ctx, `SELECT pg_notify($1, '')`, SchedulesChannel); err != nil {
		return fmt.Errorf("notify schedules: %w", err)
	}
	return nil
}
