package devstack_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
)

// tickerYAML fires every second; each run ends at once (its signal wait
// times out), and max_concurrent is high so no tick is skipped for runs
// still going.
const tickerYAML = `kind: Workflow
name: ticker
version: "1"
schedule:
  interval: 1000
  max_concurrent: 100
start:
  waitForSignal: {type: never, timeoutMs: 1}
  transitions: {success: flo.Completed}
`

// scheduledTicks lists the ticks the ticker's runs were started for, and
// when each run was started.
func scheduledTicks(t *testing.T, c *flo.Client) (ticks []time.Time, created map[time.Time]time.Time) {
	t.Helper()
	runs, _, err := c.ListRuns(context.Background(), flo.RunFilter{Workflow: "ticker", Limit: 1000})
	require.NoError(t, err)
	created = map[time.Time]time.Time{}
	for _, r := range runs {
		require.Equal(t, "schedule", r.StartedBy, "run %s", r.ID)
		ticks = append(ticks, r.ScheduledFor)
		created[r.ScheduledFor] = r.CreatedAt
	}
	return ticks, created
}

// TestScheduleThroughAWorkflowCrash kills the workflow process holding an
// interval schedule with SIGKILL, mid-way between ticks or in one: after the
// restart the schedule goes on, no tick ever starts two runs, and the ticks
// missed while it was down start at most one catch-up run.
func TestScheduleThroughAWorkflowCrash(t *testing.T) {
	pl := startProcessPlatform(t)
	c := pl.client(t)
	_, _, err := c.CreateWorkflow(context.Background(), tickerYAML)
	require.NoError(t, err)

	require.Eventually(t, func() bool { ticks, _ := scheduledTicks(t, c); return len(ticks) >= 3 }, time.Minute, 50*time.Millisecond, "the schedule never fired")
	down := time.Now()
	pl.procs["workflow"].crash(t)
	up := time.Now()
	require.Eventually(t, func() bool {
		after := 0
		ticks, _ := scheduledTicks(t, c)
		for _, tick := range ticks {
			if tick.After(up) {
				after++
			}
		}
		return after >= 3
	}, time.Minute, 50*time.Millisecond, "the schedule did not go on after the crash")

	ticks, created := scheduledTicks(t, c)
	seen := map[time.Time]bool{}
	during := 0
	for _, tick := range ticks {
		require.False(t, seen[tick], "tick %s started two runs", tick)
		seen[tick] = true
		if tick.After(down) && !tick.After(up) {
			during++
		}
	}
	t.Logf("down %s, up %s, ticks %v", down.Format(time.StampMilli), up.Format(time.StampMilli), ticks)
	// Ticks due while the process was down are one catch-up run at most.
	require.LessOrEqual(t, during, 1, "downtime %s started %d catch-up runs", up.Sub(down), during)
	if up.Sub(down) < 900*time.Millisecond {
		// Down for less than a tick: no tick is skipped, unless the one
		// before it was fired a whole interval late (a box too busy to
		// keep up), which makes that late run the one catch-up.
		slices.SortFunc(ticks, func(a, b time.Time) int { return a.Compare(b) })
		for i := 1; i < len(ticks); i++ {
			gap := ticks[i].Sub(ticks[i-1])
			require.Zero(t, gap%time.Second, "ticks %v keep the grid", ticks)
			if gap > time.Second {
				require.GreaterOrEqual(t, created[ticks[i-1]].Sub(ticks[i-1]), time.Second, "tick %s skipped after an on-time tick: %v", ticks[i-1].Add(time.Second), ticks)
			}
		}
	}
}
