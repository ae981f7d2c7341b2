package engine

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/workflow/internal/definition"
)

// testGate stands in for the runtime's gate (registry and Postgres), which
// the workflow service tests exercise for real: here it answers from maps so
// each engine path can be driven on its own.
type testGate struct {
	order  []string
	admit  map[string]Admission
	cache  map[string]json.RawMessage
	asked  []string
	orders int
}

func (g *testGate) Order(_ PlanRef, p *definition.Plan) []string {
	g.orders++
	if g.order != nil {
		return g.order
	}
	return p.ByPriority()
}

func (g *testGate) Admit(_ PlanRef, _ *definition.Plan, ex *definition.Executor, _ time.Time) Admission {
	g.asked = append(g.asked, ex.Name)
	return g.admit[ex.Name]
}

func (g *testGate) Cached(_ PlanRef, key string, _ time.Time) (json.RawMessage, bool) {
	out, ok := g.cache[key]
	return out, ok
}

const planFlow = `
kind: Workflow
name: pay
version: "1"
plans:
  charge:
    selection: static-order
    executors:
      - name: primary
        action: "@actions/charge-primary"
        priority: 100
        retry: {max_attempts: 3, backoff: exponential, initial_delay_ms: 1000, max_delay_ms: 30000}
      - name: backup
        action: "@actions/charge-backup"
        priority: 50
        retry: {max_attempts: 2, backoff: constant, initial_delay_ms: 0}
    errors:
      retryable: ["timeout"]
      fatal: ["invalid_card"]
start:
  run: "@plan/charge"
  inputMapping: '{"customer": "$.input.customer_id", "amount": "$.input.amount"}'
  transitions:
    success: done
    pending: poll
    declined: Declined
    failure: Failed
steps:
  done:
    run: "@actions/notify"
    inputMapping: '{"payment": "$.steps._start.output"}'
    transitions: {success: flo.Completed}
  poll:
    run: "@actions/check"
    transitions: {success: flo.Completed}
terminals:
  Failed: {status: failed}
  Declined: {status: failed}
`

const payInput = `{"customer_id": "c-1", "amount": 10, "idempotency_key": "k-1"}`

func newPlanSim(t *testing.T, src string, gate *testGate) *sim {
	t.Helper()
	s := newSim(t, src, payInput)
	if gate != nil {
		s.gate = gate
	}
	return s
}

// failCode reports a failure of the awaited attempt with an error code.
func (s *sim) failCode(code string) Effects {
	s.t.Helper()
	return s.do(TaskEnded{Token: s.run.Token, Outcome: "failure", Error: "declined by provider", ErrorCode: code})
}

func detailsOf(hs []HistoryEvent, typ string) []string {
	var out []string
	for _, h := range hs {
		if h.Type == typ {
			out = append(out, h.Detail)
		}
	}
	return out
}

func TestPlanFirstExecutorSucceeds(t *testing.T) {
	t.Parallel()
	s := newPlanSim(t, planFlow, &testGate{})
	eff := s.start()
	require.Len(t, eff.Invokes, 1)
	inv := eff.Invokes[0]
	require.Equal(t, "charge-primary", inv.Action)
	require.Equal(t, int32(1), inv.MaxAttempts, "the executor's retry block governs its attempts")
	require.JSONEq(t, `{"customer": "c-1", "amount": 10}`, string(inv.Payload), "inputMapping builds the plan's input")
	require.Equal(t, []string{"primary attempt 1 (@actions/charge-primary)"}, detailsOf(eff.History, HistoryPlanExecutorStart))
	require.Equal(t, WaitTask, s.run.Wait)
	require.Equal(t, StatusRunning, s.run.Status)
	require.Equal(t, []PlanEvent{{Ref: PlanRef{Namespace: "default", Workflow: "pay", Plan: "charge"}, Plan: s.def.Plans["charge"], Executor: "primary",
		Kind: PlanAttemptStarted, RunID: "run-1", Token: s.run.Token}}, eff.PlanEvents)

	eff = s.end("success", `{"payment_id": "p-1"}`)
	require.Equal(t, "done", s.run.Step)
	require.Nil(t, s.run.Plan)
	require.JSONEq(t, `{"payment_id": "p-1"}`, string(s.run.Outputs[StartStep].Output), "the winning executor's output is the step's")
	require.Equal(t, []string{"primary: success"}, detailsOf(eff.History, HistoryPlanExecutorSuccess))
	require.JSONEq(t, `{"payment": {"payment_id": "p-1"}}`, string(s.lastInvoke().Payload))
	require.Equal(t, PlanAttemptEnded, eff.PlanEvents[0].Kind)
	require.False(t, eff.PlanEvents[0].APIFailed || eff.PlanEvents[0].BusinessFailed)
}

func TestPlanFatalCodeSkipsRetriesAndMovesOn(t *testing.T) {
	t.Parallel()
	s := newPlanSim(t, planFlow, &testGate{})
	s.start()
	eff := s.failCode("invalid_card")
	require.Len(t, eff.Invokes, 1, "no retry of primary: the backup runs at once")
	require.Equal(t, "charge-backup", eff.Invokes[0].Action)
	require.Empty(t, detailsOf(eff.History, HistoryPlanExecutorRetry))
	exhausted := detailsOf(eff.History, HistoryPlanExecutorExhausted)
	require.Len(t, exhausted, 1)
	require.True(t, strings.HasPrefix(exhausted[0], "primary: failure with fatal error code invalid_card after 1 attempt(s)"), exhausted[0])
	require.True(t, eff.PlanEvents[0].BusinessFailed)
	require.False(t, eff.PlanEvents[0].APIFailed, "a fatal code is a business failure, not an API failure")

	s.end("success", `{"payment_id": "p-2"}`)
	require.Equal(t, "done", s.run.Step)
}

func TestPlanExecutorRetriesWithItsPolicy(t *testing.T) {
	t.Parallel()
	s := newPlanSim(t, planFlow, &testGate{})
	s.start()
	first := s.lastInvoke()
	eff := s.failCode("timeout")
	require.Empty(t, eff.Invokes)
	require.Equal(t, WaitPlan, s.run.Wait)
	require.Equal(t, StatusWaiting, s.run.Status)
	require.Equal(t, time.Second, s.timerIn())
	require.Equal(t, []string{"primary attempt 2 of 3 in 1s after failure: declined by provider (error code timeout)"}, detailsOf(eff.History, HistoryPlanExecutorRetry))
	require.True(t, eff.PlanEvents[0].APIFailed)

	eff = s.fire()
	require.Len(t, eff.Invokes, 1)
	require.Equal(t, "charge-primary", eff.Invokes[0].Action)
	require.NotEqual(t, first.TaskID, eff.Invokes[0].TaskID, "every attempt is its own task")
	s.fail("boom")
	require.Equal(t, 2*time.Second, s.timerIn())
	s.fire()
	eff = s.fail("boom")
	require.Equal(t, "charge-backup", eff.Invokes[0].Action, "three attempts spent: the next executor")

	s.fail("down")
	eff = s.fail("down")
	require.True(t, eff.Ended)
	require.Equal(t, "Failed", s.run.Terminal)
	require.Equal(t, "plan charge: every executor failed; the last, backup, with failure: down", s.run.Outputs[StartStep].Error)
	require.Equal(t, []string{"charge-primary", "charge-primary", "charge-primary", "charge-backup", "charge-backup"}, actions(s.invokes))
}

func actions(invs []Invoke) []string {
	out := make([]string, len(invs))
	for i, in := range invs {
		out[i] = in.Action
	}
	return out
}

func TestPlanOutcomesDriveTransitions(t *testing.T) {
	t.Parallel()
	for outcome, step := range map[string]string{"pending": "poll", "declined": ""} {
		t.Run(outcome, func(t *testing.T) {
			t.Parallel()
			s := newPlanSim(t, planFlow, &testGate{})
			s.start()
			s.end(outcome, `{"payment_id": "p-3"}`)
			require.NotContains(t, actions(s.invokes), "charge-backup", "no other executor is tried")
			require.Equal(t, outcome, s.run.Outputs[StartStep].Outcome)
			if step != "" {
				require.Equal(t, step, s.run.Step)
				return
			}
			require.Equal(t, "Declined", s.run.Terminal)
		})
	}
}

func TestPlanBreakerAndRateSkips(t *testing.T) {
	t.Parallel()
	t.Run("an open breaker passes the executor over", func(t *testing.T) {
		t.Parallel()
		g := &testGate{admit: map[string]Admission{"primary": {Skip: SkipBreakerOpen, Detail: "breaker open"}}}
		s := newPlanSim(t, planFlow, g)
		eff := s.start()
		require.Equal(t, []string{"primary: breaker open"}, detailsOf(eff.History, HistoryPlanBreakerSkip))
		require.Equal(t, "charge-backup", eff.Invokes[0].Action)
	})
	t.Run("every breaker open fails the step", func(t *testing.T) {
		t.Parallel()
		g := &testGate{admit: map[string]Admission{"primary": {Skip: SkipBreakerOpen}, "backup": {Skip: SkipBreakerOpen}}}
		s := newPlanSim(t, planFlow, g)
		eff := s.start()
		require.True(t, eff.Ended)
		require.Equal(t, "Failed", s.run.Terminal)
		require.Contains(t, s.run.Error, "no executor could be tried")
	})
	t.Run("every executor rate limited waits for room", func(t *testing.T) {
		t.Parallel()
		g := &testGate{admit: map[string]Admission{
			"primary": {Skip: SkipRateLimited, Detail: "max_per_second 1 used up", RetryAt: t0.Add(700 * time.Millisecond)},
			"backup":  {Skip: SkipRateLimited, Detail: "max_per_minute 1 used up", RetryAt: t0.Add(30 * time.Second)},
		}}
		s := newPlanSim(t, planFlow, g)
		eff := s.start()
		require.Empty(t, eff.Invokes)
		require.Equal(t, WaitPlan, s.run.Wait)
		require.Equal(t, 700*time.Millisecond, s.timerIn(), "the earliest room")
		require.Len(t, detailsOf(eff.History, HistoryPlanRateLimited), 2)
		require.Len(t, detailsOf(eff.History, HistoryPlanRateWait), 1)

		delete(g.admit, "primary")
		eff = s.fire()
		require.Equal(t, "charge-primary", eff.Invokes[0].Action)
	})
	t.Run("a rate limited executor is passed over for one with room", func(t *testing.T) {
		t.Parallel()
		g := &testGate{admit: map[string]Admission{"primary": {Skip: SkipRateLimited, RetryAt: t0.Add(time.Second)}}}
		s := newPlanSim(t, planFlow, g)
		eff := s.start()
		require.Equal(t, "charge-backup", eff.Invokes[0].Action)
		s.fail("x")
		eff = s.fail("x")
		require.Empty(t, eff.Invokes, "backup spent: wait for primary's room rather than fail")
		require.Equal(t, WaitPlan, s.run.Wait)
		delete(g.admit, "primary")
		eff = s.fire()
		require.Equal(t, "charge-primary", eff.Invokes[0].Action)
	})
}

func TestPlanFallback(t *testing.T) {
	t.Parallel()
	withFallback := func(cond string) string {
		return strings.Replace(planFlow, "    errors:\n", "    fallback:\n      value: '{\"status\": \"declined\"}'\n      condition: "+cond+"\n    errors:\n", 1)
	}
	t.Run("exhausted", func(t *testing.T) {
		t.Parallel()
		s := newPlanSim(t, withFallback("exhausted"), &testGate{})
		s.start()
		s.failCode("invalid_card")
		eff := s.failCode("invalid_card")
		require.Equal(t, "done", s.run.Step)
		require.JSONEq(t, `{"status": "declined"}`, string(s.run.Outputs[StartStep].Output))
		require.Equal(t, "success", s.run.Outputs[StartStep].Outcome)
		require.Len(t, detailsOf(eff.History, HistoryPlanFallback), 1)
		require.Len(t, s.invokes, 3, "both executors were tried, then notify")
	})
	t.Run("any_error", func(t *testing.T) {
		t.Parallel()
		s := newPlanSim(t, withFallback("any_error"), &testGate{})
		s.start()
		eff := s.failCode("invalid_card")
		require.Equal(t, "done", s.run.Step)
		require.JSONEq(t, `{"status": "declined"}`, string(s.run.Outputs[StartStep].Output))
		require.Equal(t, []string{"charge-primary", "notify"}, actions(s.invokes), "the backup is never tried")
		require.Equal(t, []string{"executor primary failed: the plan returns its fallback value"}, detailsOf(eff.History, HistoryPlanFallback))
	})
}

const asyncPlanFlow = `
kind: Workflow
name: pay
version: "1"
plans:
  charge:
    executors:
      - name: hosted
        action: "@actions/charge-hosted"
        tracking: {mode: async, timeout_ms: 60000}
      - name: backup
        action: "@actions/charge-backup"
start:
  run: "@plan/charge"
  transitions:
    success: flo.Completed
    timeout: TimedOut
    failure: flo.Failed
terminals:
  TimedOut: {status: timed_out}
`

func TestPlanAsyncTracking(t *testing.T) {
	t.Parallel()
	t.Run("completed by token", func(t *testing.T) {
		t.Parallel()
		s := newPlanSim(t, asyncPlanFlow, &testGate{})
		eff := s.start()
		require.Equal(t, StatusWaiting, s.run.Status, "an async executor's run waits in waiting")
		require.Equal(t, WaitTask, s.run.Wait)
		require.Equal(t, time.Minute, s.timerIn())
		require.Equal(t, int32(0), eff.Invokes[0].MaxAttempts, "no retry block: the action's policy")
		eff = s.end("success", `{"ok": true}`)
		require.True(t, eff.Ended)
		require.True(t, eff.ClearTimers, "the timeout timer goes")
		require.Equal(t, StatusCompleted, s.run.Status)
	})
	t.Run("timing out", func(t *testing.T) {
		t.Parallel()
		s := newPlanSim(t, asyncPlanFlow, &testGate{})
		s.start()
		late := s.run.Token
		eff := s.fire()
		require.Equal(t, "charge-backup", eff.Invokes[0].Action, "no outcome within timeout_ms: the next executor")
		exhausted := detailsOf(eff.History, HistoryPlanExecutorExhausted)
		require.Len(t, exhausted, 1)
		require.Contains(t, exhausted[0], "hosted: timeout after 1 attempt(s): no outcome within timeout_ms 60000")
		require.True(t, eff.PlanEvents[0].APIFailed)

		stale := s.do(TaskEnded{Token: late, Outcome: "success"})
		require.Equal(t, Effects{}, stale, "the late completion of the timed-out attempt changes nothing")

		eff = s.do(TaskEnded{Token: s.run.Token, Outcome: "failure", TimedOut: true, Error: "lease expired"})
		require.Equal(t, "TimedOut", s.run.Terminal, "the last executor timed out: the step's timeout transition")
		require.True(t, eff.Ended)
	})
}

const cachedPlanFlow = `
kind: Workflow
name: pay
version: "1"
plans:
  charge:
    executors:
      - name: only
        action: "@actions/charge"
    cache:
      ttl_ms: 60000
      key: "charge:{input.customer_id}:{input.idempotency_key}"
      invalidate_on: ["payment.refunded"]
start:
  run: "@plan/charge"
  transitions:
    success: flo.Completed
    failure: flo.Failed
`

func TestPlanCache(t *testing.T) {
	t.Parallel()
	t.Run("miss then store", func(t *testing.T) {
		t.Parallel()
		s := newPlanSim(t, cachedPlanFlow, &testGate{})
		eff := s.start()
		require.Equal(t, []string{"charge:c-1:k-1"}, detailsOf(eff.History, HistoryPlanCacheMiss))
		eff = s.end("success", `{"payment_id": "p-9"}`)
		require.Equal(t, []CacheWrite{{Ref: PlanRef{Namespace: "default", Workflow: "pay", Plan: "charge"}, Key: "charge:c-1:k-1",
			Output: json.RawMessage(`{"payment_id": "p-9"}`), Expires: t0.Add(time.Minute), InvalidateOn: []string{"payment.refunded"}}}, eff.CacheWrites)
	})
	t.Run("hit", func(t *testing.T) {
		t.Parallel()
		g := &testGate{cache: map[string]json.RawMessage{"charge:c-1:k-1": json.RawMessage(`{"payment_id": "p-9"}`)}}
		s := newPlanSim(t, cachedPlanFlow, g)
		eff := s.start()
		require.Empty(t, s.invokes, "served from the cache: no executor runs")
		require.Empty(t, g.asked)
		require.True(t, eff.Ended)
		require.JSONEq(t, `{"payment_id": "p-9"}`, string(s.run.Outputs[StartStep].Output))
		require.Equal(t, []string{"charge:c-1:k-1"}, detailsOf(eff.History, HistoryPlanCacheHit))
	})
	t.Run("a failure is not stored", func(t *testing.T) {
		t.Parallel()
		s := newPlanSim(t, cachedPlanFlow, &testGate{})
		s.start()
		eff := s.fail("nope")
		require.Empty(t, eff.CacheWrites)
	})
	t.Run("a key too long skips the cache", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, cachedPlanFlow, `{"customer_id": "`+strings.Repeat("c", 600)+`", "idempotency_key": "k"}`)
		s.gate = &testGate{}
		eff := s.start()
		skipped := detailsOf(eff.History, HistoryPlanCacheSkipped)
		require.Len(t, skipped, 1)
		require.Contains(t, skipped[0], "over the limit of 512")
		eff = s.end("success", `{}`)
		require.Empty(t, eff.CacheWrites)
	})
	t.Run("a key field missing skips the cache", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, cachedPlanFlow, `{"customer_id": "c-1"}`)
		s.gate = &testGate{cache: map[string]json.RawMessage{"charge:c-1:": json.RawMessage(`{}`)}}
		eff := s.start()
		require.Len(t, eff.Invokes, 1)
		require.Len(t, detailsOf(eff.History, HistoryPlanCacheSkipped), 1)
		eff = s.end("success", `{}`)
		require.Empty(t, eff.CacheWrites)
	})
}

func TestPlanOrderIsAskedOnceAndKept(t *testing.T) {
	t.Parallel()
	g := &testGate{order: []string{"backup", "primary"}}
	s := newPlanSim(t, planFlow, g)
	eff := s.start()
	require.Equal(t, "charge-backup", eff.Invokes[0].Action)
	g.order = []string{"primary", "backup"}
	s.fail("x")
	s.fail("x")
	require.Equal(t, "charge-primary", s.lastInvoke().Action, "the order of the invocation holds while it lasts")
	require.Equal(t, 1, g.orders)
	require.Equal(t, []string{"backup", "primary"}, s.run.Plan.Order)

	// The progress survives an encode and decode, as in the runs table.
	b, err := json.Marshal(s.run)
	require.NoError(t, err)
	var back Run
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, s.run.Plan, back.Plan)
}

func TestPlanCodedFailureIsClassifiedByErrors(t *testing.T) {
	t.Parallel()
	s := newPlanSim(t, planFlow, &testGate{})
	s.start()
	// A final task (FailTask by token) with a retryable code: the
	// executor's policy retries it.
	eff := s.do(TaskEnded{Token: s.run.Token, Outcome: "failure", Error: "busy", ErrorCode: "timeout", NonRetryable: true})
	require.Len(t, detailsOf(eff.History, HistoryPlanExecutorRetry), 1)
	s.fire()
	// Without a code, a non-retryable failure skips the remaining retries.
	eff = s.do(TaskEnded{Token: s.run.Token, Outcome: "failure", Error: "bad request", NonRetryable: true})
	require.Empty(t, detailsOf(eff.History, HistoryPlanExecutorRetry))
	require.Equal(t, "charge-backup", eff.Invokes[0].Action)
}
