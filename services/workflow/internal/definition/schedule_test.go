package definition_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/workflow/internal/definition"
)

// scheduled is a one-step workflow with schedule written as body (indented
// fields), the schedule key on line 4.
func scheduled(body string) string {
	return "kind: Workflow\nname: x\nversion: \"1\"\nschedule:\n" + body +
		"start: {run: \"@actions/a\", transitions: {success: flo.Completed}}\n"
}

// scheduleSeeds cover every schedule field, and broken schedules, for
// FuzzParse.
var scheduleSeeds = []string{
	scheduled("  cron: \"30 2 * * 7\"\n  timezone: Europe/Paris\n  max_concurrent: 3\n  input: '{\"mode\": \"full\"}'\n  paused: true\n"),
	scheduled("  interval: 30000\n  max_concurrent: 1\n  input: '{\"mode\": \"incremental\"}'\n"),
	scheduled("  cron: \"0 9 * * 1-5\"\n  interval: 5\n"),
	scheduled("  cron: \"TZ=UTC\"\n"),
	scheduled("  cron: \"* * * * 5-7/2\"\n  max_concurrent: 100000\n"),
	scheduled("  interval: 1.5\n  paused: 1\n"),
	scheduled("  {}\n"),
}

func TestReconcileAccountsModel(t *testing.T) {
	t.Parallel()
	def, _ := parseFile(t, "reconcile-accounts.yaml")
	s := def.Schedule
	require.NotNil(t, s)
	require.Equal(t, "0 */6 * * *", s.Cron)
	require.Zero(t, s.Interval)
	require.Equal(t, time.UTC, s.Location, "UTC unless the schedule names a zone")
	require.Equal(t, 1, s.MaxConcurrent)
	require.Equal(t, json.RawMessage(`{"mode":"full"}`), s.Input)
	require.False(t, s.Paused)
	now := time.Date(2026, 3, 1, 7, 15, 0, 0, time.UTC)
	require.Equal(t, time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), s.First(now))
	require.Equal(t, "0 */6 * * *", s.Describe())
}

func TestScheduleDefaults(t *testing.T) {
	t.Parallel()
	def, diags, err := definition.Parse([]byte(scheduled("  interval: 30000\n")))
	require.NoError(t, err, "%v", diags)
	s := def.Schedule
	require.Equal(t, 30*time.Second, s.Interval)
	require.Equal(t, 1, s.MaxConcurrent)
	require.Equal(t, json.RawMessage(`{}`), s.Input)
	require.False(t, s.Paused)
	require.Equal(t, "every 30000 ms", s.Describe())

	def, _, err = definition.Parse([]byte(scheduleSeeds[0]))
	require.NoError(t, err)
	require.True(t, def.Schedule.Paused)
	require.Equal(t, 3, def.Schedule.MaxConcurrent)
	require.Equal(t, "Europe/Paris", def.Schedule.Location.String())

	noSchedule, _, err := definition.Parse([]byte("kind: Workflow\nname: x\nversion: \"1\"\nstart: {run: \"@actions/a\", transitions: {success: flo.Completed}}\n"))
	require.NoError(t, err)
	require.Nil(t, noSchedule.Schedule)
}

func TestScheduleNext(t *testing.T) {
	t.Parallel()
	parse := func(body string) *definition.Schedule {
		def, diags, err := definition.Parse([]byte(scheduled(body)))
		require.NoError(t, err, "%v", diags)
		return def.Schedule
	}
	at := func(h, m, s int) time.Time { return time.Date(2026, 3, 1, h, m, s, 0, time.UTC) } // a Sunday

	every := parse("  interval: 1000\n")
	tick := at(10, 0, 0)
	require.Equal(t, at(10, 0, 1), every.Next(tick, tick.Add(10*time.Millisecond)), "on time: the next tick")
	require.Equal(t, at(10, 0, 6), every.Next(tick, at(10, 0, 5).Add(300*time.Millisecond)), "after downtime: the grid's next tick, not a burst")
	require.Equal(t, at(10, 0, 6), every.Next(tick, at(10, 0, 5)), "a tick exactly now is not the next one")

	fives := parse("  cron: \"*/5 * * * *\"\n")
	require.Equal(t, at(10, 5, 0), fives.First(at(10, 0, 0)))
	require.Equal(t, at(10, 5, 0), fives.Next(at(10, 0, 0), at(10, 3, 59)))
	require.Equal(t, at(11, 0, 0), fives.Next(at(10, 0, 0), at(10, 57, 0)), "missed ticks are skipped")

	sunday := parse("  cron: \"30 2 * * 7\"\n")
	require.Equal(t, time.Date(2026, 3, 8, 2, 30, 0, 0, time.UTC), sunday.First(at(3, 0, 0)), "7 is Sunday")
	weekend := parse("  cron: \"0 0 * * 6-7\"\n")
	require.Equal(t, time.Date(2026, 3, 7, 0, 0, 0, 0, time.UTC), weekend.First(at(3, 0, 0)), "6-7 is Saturday and Sunday")
	require.Equal(t, time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC), weekend.First(time.Date(2026, 3, 7, 1, 0, 0, 0, time.UTC)))

	paris := parse("  cron: \"0 9 * * *\"\n  timezone: Europe/Paris\n")
	require.Equal(t, time.Date(2026, 3, 2, 8, 0, 0, 0, time.UTC), paris.First(at(10, 0, 0)).UTC(), "9:00 in Paris is 8:00 UTC in winter")
	require.Equal(t, "0 9 * * * (Europe/Paris)", paris.Describe())
}
