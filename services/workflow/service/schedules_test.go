package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/service"
)

// reconcileYAML is the reference's reconcile-accounts with the schedule
// given as the schedule's fields.
const reconcileYAML = `kind: Workflow
name: reconcile-accounts
version: "%s"
schedule:
%s
start:
  run: "@actions/reconcile"
  transitions:
    success: generate_report
    failure: flo.Failed
steps:
  generate_report:
    run: "@actions/reconcile-report"
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

func scheduleTick(tick time.Duration) func(*service.Config) {
	return func(c *service.Config) { c.ScheduleTick = tick }
}

// firedLog records which replica started which run: the runner says so at
// debug level ("schedule fired"); everything at warning and above goes to
// the test log.
type firedLog struct {
	slog.Handler
	mu   sync.Mutex
	runs map[string]time.Time
}

func newFiredLog() *firedLog {
	return &firedLog{Handler: testLog().Handler(), runs: map[string]time.Time{}}
}

func (h *firedLog) Enabled(_ context.Context, l slog.Level) bool { return true }

func (h *firedLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "schedule fired" {
		var (
			id   string
			tick time.Time
		)
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "run_id":
				id = a.Value.String()
			case "tick":
				tick = a.Value.Time()
			}
			return true
		})
		h.mu.Lock()
		h.runs[id] = tick
		h.mu.Unlock()
		return nil
	}
	if r.Level < slog.LevelWarn {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

// last is the latest tick this replica fired.
func (h *firedLog) last() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var last time.Time
	for _, tick := range h.runs {
		if tick.After(last) {
			last = tick
		}
	}
	return last
}

// scheduledRun is a run a schedule started and the tick its history names.
type scheduledRun struct {
	id   string
	tick time.Time
	// created is when the run was started: later than tick by how late
	// the scheduler fired it.
	created time.Time
}

// scheduledRuns lists a workflow's runs with their ticks, oldest tick first;
// every one must open its history with schedule_fired.
func (e *env) scheduledRuns(t testing.TB, ns, workflow string) []scheduledRun {
	t.Helper()
	resp, err := e.client().ListRuns(t.Context(), &flov1.ListRunsRequest{Namespace: ns, Workflow: workflow, Limit: 1000})
	require.NoError(t, err)
	var out []scheduledRun
	for _, run := range resp.GetRuns() {
		hist := e.history(t, ns, run.GetRunId())
		require.NotEmpty(t, hist)
		require.Equal(t, "schedule_fired", hist[0].GetType(), "run %s", run.GetRunId())
		tick, err := time.Parse(time.RFC3339Nano, hist[0].GetDetail())
		require.NoError(t, err)
		out = append(out, scheduledRun{id: run.GetRunId(), tick: tick, created: run.GetCreatedAt().AsTime()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].tick.Before(out[j].tick) })
	return out
}

// schedule reads a workflow's schedule from ListSchedules; ok is false when
// it has none.
func (e *env) schedule(t testing.TB, ns, workflow string) (_ *flov1.WorkflowSchedule, ok bool) {
	t.Helper()
	resp, err := e.client().ListSchedules(t.Context(), &flov1.ListSchedulesRequest{Namespace: ns})
	require.NoError(t, err)
	for _, s := range resp.GetSchedules() {
		if s.GetWorkflow() == workflow {
			return s, true
		}
	}
	return nil, false
}

func reconcileWorker(t *testing.T, e *env, ns string, hold chan struct{}) {
	e.worker(t, ns, script{
		"reconcile": func(*flov1.TaskAssignment) reply {
			if hold != nil {
				<-hold
			}
			return ok(`{"reconciled":true}`)
		},
		"reconcile-report": func(*flov1.TaskAssignment) reply { return ok(`{}`) },
	})
}

// TestScheduleIntervalAcrossReplicas: an interval of one second with two
// replicas starts one run per tick, every second; stopping the replica that
// fired the last tick neither skips nor doubles the next.
func TestScheduleIntervalAcrossReplicas(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	e := &env{dbURL: harness.NewDatabase(t), brokers: broker.Addrs()}
	e.dispatcher = startDispatcher(t, e.dbURL, e.brokers)
	logs := []*firedLog{newFiredLog(), newFiredLog()}
	replicas := []*wfReplica{
		startWorkflowWith(t, e.dbURL, e.brokers, slog.New(logs[0]), nil),
		startWorkflowWith(t, e.dbURL, e.brokers, slog.New(logs[1]), nil),
	}
	e.wf = replicas[0]
	ns := e.namespace(t)
	reconcileWorker(t, e, ns, nil)
	// max_concurrent leaves room for runs a loaded box takes over a
	// second to finish: this test is about ticks, not concurrency.
	e.create(t, ns, fmt.Sprintf(reconcileYAML, "1", "  interval: 1000\n  max_concurrent: 10\n  input: '{\"mode\": \"incremental\"}'"))

	ticks := func() int { return len(e.scheduledRuns(t, ns, "reconcile-accounts")) }
	require.Eventually(t, func() bool { return ticks() >= 2 }, waitFor, tick)
	taker := 0
	if logs[1].last().After(logs[0].last()) {
		taker = 1
	}
	stoppedAfter := logs[taker].last()
	replicas[taker].stop()
	e.wf = replicas[1-taker]
	require.Eventually(t, func() bool { return ticks() >= 4 }, waitFor, tick)

	runs := e.scheduledRuns(t, ns, "reconcile-accounts")
	for i := 1; i < len(runs); i++ {
		gap := runs[i].tick.Sub(runs[i-1].tick)
		require.Positive(t, gap, "ticks %d and %d: one run per tick", i-1, i)
		require.Zero(t, gap%time.Second, "ticks %d and %d keep the one-second grid", i-1, i)
		if gap > time.Second {
			// A tick is passed over only when the one before it was
			// fired a whole interval late (a box too busy to keep
			// up): that late run was the one catch-up run.
			late := runs[i-1].created.Sub(runs[i-1].tick)
			require.GreaterOrEqual(t, late, time.Second, "ticks %d and %d are %s apart, yet tick %d was fired on time (%s late)", i-1, i, gap, i-1, late)
		}
	}
	require.True(t, runs[len(runs)-1].tick.After(stoppedAfter), "ticks went on after the replica that fired %s stopped", stoppedAfter)
	for _, r := range runs {
		run := e.waitRun(t, ns, r.id, stCompleted)
		require.JSONEq(t, `{"mode": "incremental"}`, string(run.GetInput()))
		require.Equal(t, "schedule", run.GetStartedBy())
		require.Equal(t, r.tick, run.GetScheduledFor().AsTime())
	}
	row, ok := e.schedule(t, ns, "reconcile-accounts")
	require.True(t, ok)
	require.GreaterOrEqual(t, row.GetFired(), int64(len(runs)))
	require.Zero(t, row.GetSkipped(), "no tick was skipped for max_concurrent")
	require.Equal(t, int64(1000), row.GetIntervalMs())
	require.Equal(t, "active", row.GetState())
}

// TestScheduleMaxConcurrentSkips: with max_concurrent 1 and a run held by
// its worker, ticks are skipped and counted; once it is released runs start
// again.
func TestScheduleMaxConcurrentSkips(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	ns := e.namespace(t)
	hold := make(chan struct{})
	reconcileWorker(t, e, ns, hold)
	e.create(t, ns, fmt.Sprintf(reconcileYAML, "1", "  interval: 100\n  max_concurrent: 1"))

	require.Eventually(t, func() bool {
		row, _ := e.schedule(t, ns, "reconcile-accounts")
		return row.GetSkipped() >= 3
	}, waitFor, tick)
	require.Len(t, e.scheduledRuns(t, ns, "reconcile-accounts"), 1, "one run while it is going")
	close(hold)
	require.Eventually(t, func() bool { return len(e.scheduledRuns(t, ns, "reconcile-accounts")) >= 3 }, waitFor, tick)
	row, _ := e.schedule(t, ns, "reconcile-accounts")
	require.Equal(t, "active", row.GetState())
}

// TestScheduleFakeClock moves an injected clock: a cron schedule fires at
// its minute, schedules page, disable pauses and enable resumes from now, a
// tick whose firing transaction rolls back fires once later, and a version
// without a schedule removes it. Nothing here waits for real time to pass.
func TestScheduleFakeClock(t *testing.T) {
	t.Parallel()
	clock := harness.NewClock(time.Date(2026, 3, 1, 10, 2, 30, 0, time.UTC))
	broker := harness.NewBroker(t)
	e := &env{dbURL: harness.NewDatabase(t), brokers: broker.Addrs()}
	e.dispatcher = startDispatcher(t, e.dbURL, e.brokers)
	e.wf = startWorkflowWith(t, e.dbURL, e.brokers, testLog(), []service.Option{service.WithClock(clock.Now)}, scheduleTick(20*time.Millisecond))
	ns := e.namespace(t)
	reconcileWorker(t, e, ns, nil)
	// count is how many runs a schedule started, once all have ended (a
	// run still going would make the next tick a skip); -1 before.
	count := func(workflow string) int {
		runs := e.scheduledRuns(t, ns, workflow)
		for _, r := range runs {
			if !isEnded(e.run(t, ns, r.id).GetStatus()) {
				return -1
			}
		}
		return len(runs)
	}

	// Cron: */5 fires at 10:05, not before, then waits for 10:10.
	e.create(t, ns, fmt.Sprintf(reconcileYAML, "1", `  cron: "*/5 * * * *"`))
	row, ok := e.schedule(t, ns, "reconcile-accounts")
	require.True(t, ok)
	require.Equal(t, time.Date(2026, 3, 1, 10, 5, 0, 0, time.UTC), row.GetNextFireAt().AsTime())
	require.Equal(t, "*/5 * * * *", row.GetCron())
	require.Equal(t, "UTC", row.GetTimezone())
	require.Equal(t, "1", row.GetVersion())
	require.Nil(t, row.GetLastFireAt(), "not fired yet")
	clock.Set(time.Date(2026, 3, 1, 10, 5, 0, 500_000_000, time.UTC))
	require.Eventually(t, func() bool { return count("reconcile-accounts") == 1 }, waitFor, tick)
	runs := e.scheduledRuns(t, ns, "reconcile-accounts")
	require.Equal(t, time.Date(2026, 3, 1, 10, 5, 0, 0, time.UTC), runs[0].tick.UTC())
	row, _ = e.schedule(t, ns, "reconcile-accounts")
	require.Equal(t, time.Date(2026, 3, 1, 10, 10, 0, 0, time.UTC), row.GetNextFireAt().AsTime())
	require.Equal(t, runs[0].tick.UTC(), row.GetLastFireAt().AsTime())

	// Disable pauses: a second schedule in step with it fires twice while
	// the disabled one starts nothing and keeps its next fire time.
	e.create(t, ns, `kind: Workflow
name: control
version: "1"
schedule:
  cron: "*/5 * * * *"
start: {run: "@actions/reconcile-report", transitions: {success: flo.Completed}}
`)
	// Two schedules page by workflow name.
	first, err := e.client().ListSchedules(t.Context(), &flov1.ListSchedulesRequest{Namespace: ns, Limit: 1})
	require.NoError(t, err)
	require.Len(t, first.GetSchedules(), 1)
	require.Equal(t, "control", first.GetSchedules()[0].GetWorkflow())
	require.NotEmpty(t, first.GetNextPageToken())
	second, err := e.client().ListSchedules(t.Context(), &flov1.ListSchedulesRequest{Namespace: ns, Limit: 1, PageToken: first.GetNextPageToken()})
	require.NoError(t, err)
	require.Len(t, second.GetSchedules(), 1)
	require.Equal(t, "reconcile-accounts", second.GetSchedules()[0].GetWorkflow())
	require.Empty(t, second.GetNextPageToken())

	_, err = e.client().DisableWorkflow(t.Context(), &flov1.WorkflowNameRequest{Namespace: ns, Name: "reconcile-accounts"})
	require.NoError(t, err)
	row, _ = e.schedule(t, ns, "reconcile-accounts")
	require.Equal(t, "disabled", row.GetState())
	for i, at := range []time.Time{time.Date(2026, 3, 1, 10, 10, 1, 0, time.UTC), time.Date(2026, 3, 1, 10, 15, 1, 0, time.UTC)} {
		clock.Set(at)
		require.Eventually(t, func() bool { return count("control") == i+1 }, waitFor, tick)
	}
	require.Equal(t, 1, count("reconcile-accounts"), "no runs while disabled")

	// Enable resumes from now: the next tick after 10:17, no burst for the
	// ticks missed at 10:10 and 10:15.
	clock.Set(time.Date(2026, 3, 1, 10, 17, 0, 0, time.UTC))
	_, err = e.client().EnableWorkflow(t.Context(), &flov1.WorkflowNameRequest{Namespace: ns, Name: "reconcile-accounts"})
	require.NoError(t, err)
	row, _ = e.schedule(t, ns, "reconcile-accounts")
	require.Equal(t, "active", row.GetState())
	require.Equal(t, time.Date(2026, 3, 1, 10, 20, 0, 0, time.UTC), row.GetNextFireAt().AsTime())
	clock.Set(time.Date(2026, 3, 1, 10, 20, 0, 1000, time.UTC))
	require.Eventually(t, func() bool { return count("reconcile-accounts") == 2 && count("control") == 3 }, waitFor, tick)

	// A replica that dies while firing rolls back: here a transaction holds
	// the row's lock as a firing replica would, and the scheduler passes it
	// by (the control fires meanwhile); once it rolls back the tick is
	// still due and fires once.
	conn, err := pgx.Connect(t.Context(), e.dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	tx, err := conn.Begin(t.Context())
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), `SELECT 1 FROM workflow.schedules WHERE namespace = $1 AND workflow = 'reconcile-accounts' FOR UPDATE`, ns)
	require.NoError(t, err)
	clock.Set(time.Date(2026, 3, 1, 10, 25, 1, 0, time.UTC))
	require.Eventually(t, func() bool { return count("control") == 4 }, waitFor, tick)
	require.Equal(t, 2, count("reconcile-accounts"), "the locked tick waits")
	require.NoError(t, tx.Rollback(t.Context()))
	require.Eventually(t, func() bool { return count("reconcile-accounts") == 3 }, waitFor, tick)
	runs = e.scheduledRuns(t, ns, "reconcile-accounts")
	require.Equal(t, time.Date(2026, 3, 1, 10, 25, 0, 0, time.UTC), runs[2].tick.UTC())

	// A new version without a schedule removes it.
	e.create(t, ns, `kind: Workflow
name: reconcile-accounts
version: "2"
start: {run: "@actions/reconcile", transitions: {success: flo.Completed}}
`)
	_, ok = e.schedule(t, ns, "reconcile-accounts")
	require.False(t, ok)
	clock.Set(time.Date(2026, 3, 1, 10, 30, 1, 0, time.UTC))
	require.Eventually(t, func() bool { return count("control") == 5 }, waitFor, tick)
	require.Equal(t, 3, count("reconcile-accounts"), "the removed schedule started nothing")
}
