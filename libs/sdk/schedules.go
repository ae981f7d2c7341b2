package flo

import (
	"context"
	"fmt"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// The states of a workflow schedule.
const (
	// ScheduleActive schedules start runs at their ticks.
	ScheduleActive = "active"
	// SchedulePaused schedules were written with paused: true and start nothing.
	SchedulePaused = "paused"
	// ScheduleDisabled schedules belong to a disabled workflow; enabling it resumes them from
	// then on, without making up the ticks missed.
	ScheduleDisabled = "disabled"
)

// Schedule is a workflow's schedule, written by the version that owns it, and where it
// stands.
type Schedule struct {
	Workflow string `json:"workflow"`
	Version  string `json:"version"`
	// Cron is the 5-field expression, read in Timezone; empty for an interval schedule.
	Cron     string `json:"cron,omitempty"`
	Timezone string `json:"timezone,omitempty"`
	// Interval is the time between ticks; zero for a cron schedule.
	Interval      time.Duration `json:"interval_ms,omitempty"`
	MaxConcurrent int           `json:"max_concurrent"`
	// State is ScheduleActive, SchedulePaused or ScheduleDisabled.
	State      string    `json:"state"`
	NextFireAt time.Time `json:"next_fire_at,omitzero"`
	// LastFireAt is the tick of the last run the schedule started, LastRunID that run.
	LastFireAt time.Time `json:"last_fire_at,omitzero"`
	LastRunID  string    `json:"last_run_id,omitempty"`
	// Fired counts the ticks that started a run; Skipped those that found MaxConcurrent
	// runs still going.
	Fired         int64     `json:"fired"`
	Skipped       int64     `json:"skipped"`
	LastSkippedAt time.Time `json:"last_skipped_at,omitzero"`
}

// ListSchedules returns the schedules of the client's namespace, by workflow name.
func (c *Client) ListSchedules(ctx context.Context) ([]*Schedule, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	return listPages(0, func(size int32, token string) ([]*flov1.WorkflowSchedule, string, error) {
		resp, err := svc.ListSchedules(ctx, &flov1.ListSchedulesRequest{Namespace: c.namespace, Limit: size, PageToken: token})
		if err != nil {
			return nil, "", fmt.Errorf("list schedules: %w", err)
		}
		return resp.GetSchedules(), resp.GetNextPageToken(), nil
	}, scheduleFromProto)
}

func scheduleFromProto(s *flov1.WorkflowSchedule) *Schedule {
	return &Schedule{
		Workflow: s.GetWorkflow(), Version: s.GetVersion(), Cron: s.GetCron(), Timezone: s.GetTimezone(),
		Interval: time.Duration(s.GetIntervalMs()) * time.Millisecond, MaxConcurrent: int(s.GetMaxConcurrent()),
		State: s.GetState(), NextFireAt: timeFromProto(s.GetNextFireAt()), LastFireAt: timeFromProto(s.GetLastFireAt()),
		LastRunID: s.GetLastRunId(), Fired: s.GetFired(), Skipped: s.GetSkipped(), LastSkippedAt: timeFromProto(s.GetLastSkippedAt()),
	}
}
