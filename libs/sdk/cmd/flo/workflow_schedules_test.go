package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	flo "github.com/razorbill/flo-go"
	"github.com/stretchr/testify/require"
)

// TestWorkflowSchedulesCommand lists an interval schedule as it fires, and shows that its
// runs say a schedule started them.
func TestWorkflowSchedulesCommand(t *testing.T) {
	s := startWorkflowStack(t)
	require.Equal(t, "no schedules\n", s.ok(t, "workflow", "schedules"))
	s.ok(t, "workflow", "create", "-f", writeFile(t, "tick.yaml", `kind: Workflow
name: tick
version: "1"
schedule:
  interval: 200
  max_concurrent: 3
  input: '{"mode": "incremental"}'
start:
  run: "@actions/reconcile"
  transitions: {success: flo.Completed}
`))

	var list []flo.Schedule
	require.Eventually(t, func() bool {
		list = decode[[]flo.Schedule](t, s.ok(t, "workflow", "schedules", "--json"))
		return len(list) == 1 && list[0].LastRunID != ""
	}, 30*time.Second, 50*time.Millisecond)
	sc := list[0]
	require.Equal(t, "tick", sc.Workflow)
	require.Equal(t, 3, sc.MaxConcurrent)
	require.Equal(t, flo.ScheduleActive, sc.State)
	require.True(t, sc.NextFireAt.After(sc.LastFireAt))

	var run struct {
		StartedBy    string          `json:"started_by"`
		ScheduledFor time.Time       `json:"scheduled_for"`
		Input        json.RawMessage `json:"input"`
	}
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "workflow", "status", sc.LastRunID)), &run))
	require.Equal(t, "schedule", run.StartedBy)
	require.Equal(t, sc.LastFireAt, run.ScheduledFor)
	require.JSONEq(t, `{"mode":"incremental"}`, string(run.Input))
	history := s.ok(t, "workflow", "history", sc.LastRunID)
	require.Regexp(t, `(?m)^\s*1  \S+  schedule_fired\s`, history)

	s.ok(t, "workflow", "disable", "tick")
	table := s.ok(t, "workflow", "schedules")
	require.Regexp(t, `(?m)^WORKFLOW\s+VERSION\s+SCHEDULE\s+NEXT FIRE\s+LAST FIRE\s+LAST RUN\s+STATE\s+FIRED\s+SKIPPED$`, table)
	require.Regexp(t, `(?m)^tick\s+1\s+every 200 ms\s+\S+\s+\S+\s+`+sc.LastRunID[:8]+`\S*\s+disabled\s+\d+\s+\d+$`, table)
}

func TestPrintSchedules(t *testing.T) {
	var b strings.Builder
	next := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	require.NoError(t, printSchedules(&b, []*flo.Schedule{
		{Workflow: "reconcile-accounts", Version: "1.0.0", Cron: "0 */6 * * *", Timezone: "UTC", MaxConcurrent: 1,
			State: flo.SchedulePaused, NextFireAt: next},
	}))
	require.Equal(t, "WORKFLOW            VERSION  SCHEDULE         NEXT FIRE                 LAST FIRE  LAST RUN  STATE   FIRED  SKIPPED\n"+
		"reconcile-accounts  1.0.0    0 */6 * * * UTC  2026-03-01T12:00:00.000Z  -          -         paused  0      0\n", b.String())
}
