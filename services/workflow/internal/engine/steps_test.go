package engine

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/workflow/internal/definition"
)

const pollFlow = `
kind: Workflow
name: poller
version: "1"
start:
  run: "@actions/charge"
  transitions:
    success: check_status
    failure: flo.Failed
steps:
  check_status:
    run: "@actions/check-payment-status"
    inputMapping: '{"payment_id": "$.steps._start.output.payment_id"}'
    poll:
      initialDelayMs: 2000
      maxAttempts: 4
      backoff: exponential
      baseDelayMs: 1000
      maxDelayMs: 30000
    transitions:
      success: flo.Completed
      failure: flo.Failed
      timeout: PaymentTimeout
terminals:
  PaymentTimeout: {status: timed_out}
`

func TestPoll(t *testing.T) {
	t.Parallel()
	toPolling := func(t *testing.T, src string) *sim {
		s := newSim(t, src, `{}`)
		s.start()
		s.end("success", `{"payment_id": "pay-7"}`)
		require.Equal(t, "check_status", s.run.Step)
		require.JSONEq(t, `{"payment_id": "pay-7"}`, string(s.lastInvoke().Payload))
		return s
	}

	t.Run("to success", func(t *testing.T) {
		t.Parallel()
		s := toPolling(t, pollFlow)
		first := s.lastInvoke()
		eff := s.end("pending", `{"state": "processing"}`)
		require.Equal(t, WaitPoll, s.run.Wait)
		require.Equal(t, StatusWaiting, s.run.Status)
		require.Equal(t, 1, s.run.Polls)
		require.Equal(t, 2*time.Second, s.timerIn(), "initialDelayMs before the first poll")
		require.Equal(t, WaitPoll, s.timers[0].Kind)
		require.Equal(t, []string{"action_completed", "poll_scheduled"}, historyTypes(eff.History))
		require.Equal(t, "pending", eff.History[0].Detail)

		eff = s.fire()
		require.Len(t, eff.Invokes, 1)
		require.NotEqual(t, first.TaskID, eff.Invokes[0].TaskID)
		require.JSONEq(t, `{"payment_id": "pay-7"}`, string(eff.Invokes[0].Payload))
		require.Equal(t, int32(0), eff.Invokes[0].MaxAttempts)
		require.Equal(t, 1, s.run.Attempt, "polls are not retries")

		s.end("pending", `{}`)
		require.Equal(t, time.Second, s.timerIn(), "then the backoff from baseDelayMs")
		s.fire()
		eff = s.end("success", `{"state": "settled"}`)
		require.True(t, eff.Ended)
		require.Equal(t, StatusCompleted, s.run.Status)
		require.Equal(t, `{"state": "settled"}`, string(s.run.Outputs["check_status"].Output))
	})

	t.Run("to timeout", func(t *testing.T) {
		t.Parallel()
		s := toPolling(t, pollFlow)
		var delays []time.Duration
		for i := 0; i < 4; i++ {
			s.end("pending", `{}`)
			delays = append(delays, s.timerIn())
			s.fire()
		}
		require.Equal(t, []time.Duration{2 * time.Second, time.Second, 2 * time.Second, 4 * time.Second}, delays)
		eff := s.end("pending", `{}`)
		require.True(t, eff.Ended)
		require.Equal(t, "PaymentTimeout", s.run.Terminal)
		require.Equal(t, StatusTimedOut, s.run.Status)
		require.Equal(t, "timeout", s.run.Outputs["check_status"].Outcome)
		require.Equal(t, "still pending after 4 polls", s.run.Outputs["check_status"].Error)
		require.Equal(t, "workflow_timed_out", eff.History[len(eff.History)-1].Type)
		require.Equal(t, 4, countType(s.history, "poll_scheduled"))
	})

	t.Run("timeout without a timeout transition takes failure", func(t *testing.T) {
		t.Parallel()
		src := `
kind: Workflow
name: poller
version: "1"
start:
  run: "@actions/check"
  poll: {maxAttempts: 1, initialDelayMs: 10}
  transitions:
    success: flo.Completed
    failure: CheckFailed
terminals:
  CheckFailed: {status: failed}
`
		s := newSim(t, src, `{}`)
		s.start()
		s.end("pending", `{}`)
		s.fire()
		eff := s.end("pending", `{}`)
		require.True(t, eff.Ended)
		require.Equal(t, "CheckFailed", s.run.Terminal)
	})

	t.Run("pending without poll follows the pending transition", func(t *testing.T) {
		t.Parallel()
		src := `
kind: Workflow
name: async
version: "1"
start:
  run: "@actions/charge"
  transitions:
    success: flo.Completed
    pending: check
    failure: flo.Failed
steps:
  check:
    run: "@actions/check"
    transitions:
      success: flo.Completed
`
		s := newSim(t, src, `{}`)
		s.start()
		s.end("pending", `{}`)
		require.Equal(t, "check", s.run.Step)
		require.Equal(t, "check", s.lastInvoke().Action)
	})

	t.Run("a failure between polls retries with fresh polls", func(t *testing.T) {
		t.Parallel()
		src := `
kind: Workflow
name: poller
version: "1"
start:
  run: "@actions/check"
  poll: {maxAttempts: 2, initialDelayMs: 10}
  retry: {max_attempts: 2, backoff: constant, initial_delay_ms: 10}
  transitions:
    success: flo.Completed
    failure: flo.Failed
`
		s := newSim(t, src, `{}`)
		s.start()
		s.end("pending", `{}`)
		s.fire()
		require.Equal(t, 1, s.run.Polls)
		s.fail("flaky")
		require.Equal(t, WaitRetry, s.run.Wait)
		require.Equal(t, 0, s.run.Polls)
		s.fire()
		s.end("pending", `{}`)
		require.Equal(t, 1, s.run.Polls)
	})
}

func TestInputMapping(t *testing.T) {
	t.Parallel()
	src := `
kind: Workflow
name: mapper
version: "1"
start:
  run: "@actions/enrich"
  inputMapping: '{"customer_id": "$.input.customer_id", "domain": "$.input.company.domain"}'
  transitions:
    success: charge
    failure: flo.Failed
steps:
  charge:
    run: "@actions/charge"
    inputMapping: '{"all": "$.input", "enriched": "$.steps._start.output", "email": "$.steps._start.output.email", "first_tag": "$.steps._start.output.tags[0]", "outcome": "$.steps._start.outcome", "run": "$.flo.run_id", "at": "$.flo.timestamp", "literal": "kept", "n": 3, "nested": {"list": ["$.input.customer_id", true]}}'
    transitions:
      success: flo.Completed
      failure: flo.Failed
`
	input := `{"customer_id": "c-1", "company": {"domain": "acme.io"}, "amount": 5}`
	s := newSim(t, src, input)
	eff := s.start()
	require.JSONEq(t, `{"customer_id": "c-1", "domain": "acme.io"}`, string(eff.Invokes[0].Payload))
	s.now = s.now.Add(1500 * time.Millisecond)
	eff = s.end("success", `{"email": "a@acme.io", "tags": ["vip", "eu"]}`)
	want := fmt.Sprintf(`{
		"all": %s,
		"enriched": {"email": "a@acme.io", "tags": ["vip", "eu"]},
		"email": "a@acme.io",
		"first_tag": "vip",
		"outcome": "success",
		"run": "run-1",
		"at": %d,
		"literal": "kept",
		"n": 3,
		"nested": {"list": ["c-1", true]}
	}`, input, s.now.UnixMilli())
	require.JSONEq(t, want, string(eff.Invokes[0].Payload))
}

func TestInputMappingMissingPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		transitions  string
		wantTerminal string
		wantError    string
	}{
		{
			name:         "falls back to the failure transition",
			transitions:  "success: flo.Completed\n    failure: MappingFailed",
			wantTerminal: "MappingFailed",
		},
		{
			name:         "takes execution_failure first",
			transitions:  "success: flo.Completed\n    execution_failure: Broken\n    failure: MappingFailed",
			wantTerminal: "Broken",
		},
		{
			name:         "without a fallback the run fails naming step and outcome",
			transitions:  "success: flo.Completed",
			wantTerminal: "flo.Failed",
			wantError:    `step "_start" has no transition for outcome "execution_failure"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := `
kind: Workflow
name: mapper
version: "1"
terminals:
  MappingFailed: {status: failed}
  Broken: {status: failed}
start:
  run: "@actions/charge"
  inputMapping: '{"amount": "$.input.order.amount"}'
  retry: {max_attempts: 5, backoff: constant, initial_delay_ms: 10}
  transitions:
    ` + tt.transitions + "\n"
			s := newSim(t, src, `{"order": {}}`)
			eff := s.start()
			require.True(t, eff.Ended)
			require.Empty(t, eff.Invokes)
			require.Equal(t, StatusFailed, s.run.Status)
			require.Equal(t, tt.wantTerminal, s.run.Terminal)
			res := s.run.Outputs[StartStep]
			require.Equal(t, "execution_failure", res.Outcome)
			require.Contains(t, res.Error, `"$.input.order.amount"`)
			require.Contains(t, res.Error, "has no value at .order.amount")
			require.Contains(t, s.run.Error, `"$.input.order.amount"`)
			if tt.wantError != "" {
				require.Contains(t, s.run.Error, tt.wantError)
			}
			require.Zero(t, countType(s.history, "step_retry"), "retrying cannot fix a mapping")
		})
	}
}

const childFlow = `
kind: Workflow
name: parent
version: "1"
start:
  run: "@workflow/payment-flow"
  transitions:
    success: pinned
    failure: ChildFailed
steps:
  pinned:
    run: "@workflow/payment-flow:2.0.0"
    inputMapping: '{"paid": "$.steps._start.output.paid"}'
    transitions:
      success: flo.Completed
      failure: ChildFailed
      target_not_found: NoSuchChild
terminals:
  ChildFailed: {status: failed}
  NoSuchChild: {status: failed}
`

func TestChildWorkflow(t *testing.T) {
	t.Parallel()
	start := func(t *testing.T) (*sim, ChildStart) {
		s := newSim(t, childFlow, `{"order": 1}`)
		eff := s.start()
		require.Empty(t, eff.Invokes)
		require.Len(t, eff.Children, 1)
		c := eff.Children[0]
		require.Equal(t, ChildStart{RunID: "child-1", Workflow: "payment-flow", Input: raw(`{"order": 1}`), ParentToken: s.run.Token}, c)
		require.Equal(t, WaitChild, s.run.Wait)
		require.Equal(t, StatusRunning, s.run.Status)
		require.Equal(t, []string{"workflow_started", "step_started", "child_started"}, s.types())
		require.Equal(t, "@workflow/payment-flow as run child-1", s.history[2].Detail)
		return s, c
	}

	t.Run("success then a pinned version", func(t *testing.T) {
		t.Parallel()
		s, c := start(t)
		eff := s.do(ChildEnded{Token: c.ParentToken, Status: StatusCompleted, Output: raw(`{"paid": true}`)})
		require.Equal(t, []string{"child_completed", "step_completed", "step_started", "child_started"}, historyTypes(eff.History))
		require.Equal(t, "completed", eff.History[0].Detail)
		require.Len(t, eff.Children, 1)
		pinned := eff.Children[0]
		require.Equal(t, "payment-flow", pinned.Workflow)
		require.Equal(t, "2.0.0", pinned.Version)
		require.JSONEq(t, `{"paid": true}`, string(pinned.Input))
		require.Equal(t, "child-2", pinned.RunID)

		// The first child's end again is stale.
		require.Equal(t, Effects{}, s.do(ChildEnded{Token: c.ParentToken, Status: StatusCompleted}))

		eff = s.do(ChildEnded{Token: pinned.ParentToken, Status: StatusCompleted})
		require.True(t, eff.Ended)
		require.Equal(t, StatusCompleted, s.run.Status)
	})

	for _, st := range []Status{StatusFailed, StatusCancelled, StatusTimedOut} {
		t.Run("child "+string(st)+" is failure", func(t *testing.T) {
			t.Parallel()
			s, c := start(t)
			eff := s.do(ChildEnded{Token: c.ParentToken, Status: st})
			require.True(t, eff.Ended)
			require.Equal(t, "ChildFailed", s.run.Terminal)
			require.Equal(t, "failure", s.run.Outputs[StartStep].Outcome)
			require.Contains(t, s.run.Error, "child workflow @workflow/payment-flow ended "+string(st))
		})
	}

	t.Run("a child that cannot start", func(t *testing.T) {
		t.Parallel()
		s, c := start(t)
		s.do(ChildEnded{Token: c.ParentToken, Status: StatusCompleted, Output: raw(`{"paid": true}`)})
		eff := s.do(TaskEnded{Token: s.run.Token, Outcome: "target_not_found", Error: "workflow payment-flow version 2.0.0 not found"})
		require.True(t, eff.Ended)
		require.Equal(t, "NoSuchChild", s.run.Terminal)
		require.Equal(t, "child_completed", eff.History[0].Type)
		require.Contains(t, s.run.Error, "version 2.0.0 not found")
	})

	t.Run("a task end for another token is stale", func(t *testing.T) {
		t.Parallel()
		s, c := start(t)
		require.Equal(t, Effects{}, s.do(TaskEnded{Token: c.ParentToken + "0", Outcome: "success"}))
		require.Equal(t, Effects{}, s.do(ChildEnded{Token: "", Status: StatusCompleted}))
	})
}

func TestExecutionOutcomeFallback(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		transitions  string
		outcome      string
		wantHistory  string
		wantTerminal string
	}{
		{"target_not_found has its own", "target_not_found: A\n    execution_failure: B\n    failure: C", "target_not_found", "action_not_found", "A"},
		{"target_not_found to execution_failure", "execution_failure: B\n    failure: C", "target_not_found", "action_not_found", "B"},
		{"target_not_found to failure", "failure: C", "target_not_found", "action_not_found", "C"},
		{"target_disabled has its own", "target_disabled: A\n    failure: C", "target_disabled", "action_disabled", "A"},
		{"target_disabled to execution_failure", "target_not_found: A\n    execution_failure: B\n    failure: C", "target_disabled", "action_disabled", "B"},
		{"target_disabled to failure", "target_not_found: A\n    failure: C", "target_disabled", "action_disabled", "C"},
		{"a business outcome matches exactly", "failure: C\n    timeout: A", "timeout", "action_completed", "A"},
		{"a named outcome", "approved: B\n    failure: C", "approved", "action_completed", "B"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := `
kind: Workflow
name: fallback
version: "1"
terminals:
  A: {status: failed}
  B: {status: failed}
  C: {status: failed}
start:
  run: "@actions/charge"
  transitions:
    success: flo.Completed
    ` + tt.transitions + "\n"
			s := newSim(t, src, `{}`)
			s.start()
			eff := s.end(tt.outcome, "")
			require.Equal(t, tt.wantHistory, eff.History[0].Type)
			if tt.wantHistory != "action_completed" {
				require.Equal(t, "charge", eff.History[0].Detail)
			}
			require.Equal(t, tt.wantTerminal, s.run.Terminal)
			require.Equal(t, tt.outcome, s.run.Outputs[StartStep].Outcome)
		})
	}
}

func TestMissingTransitionFailsTheRun(t *testing.T) {
	t.Parallel()
	s := newSim(t, processOrder, `{}`)
	s.start()
	eff := s.end("approved", `{}`)
	require.True(t, eff.Ended)
	require.Equal(t, StatusFailed, s.run.Status)
	require.Equal(t, "flo.Failed", s.run.Terminal)
	require.Equal(t, `step "_start" has no transition for outcome "approved"`, s.run.Error)
	last := eff.History[len(eff.History)-1]
	require.Equal(t, "workflow_failed", last.Type)
	require.Contains(t, last.Detail, `no transition for outcome "approved"`)
}

func TestTerminals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		terminal    string
		wantStatus  Status
		wantHistory string
	}{
		{"flo.Completed", StatusCompleted, "workflow_completed"},
		{"flo.Failed", StatusFailed, "workflow_failed"},
		{"flo.Cancelled", StatusCancelled, "workflow_cancelled"},
		{"flo.TimedOut", StatusTimedOut, "workflow_timed_out"},
		{"Shipped", StatusCompleted, "workflow_completed"},
		{"Rejected", StatusFailed, "workflow_failed"},
		{"Withdrawn", StatusCancelled, "workflow_cancelled"},
		{"Expired", StatusTimedOut, "workflow_timed_out"},
	}
	for _, tt := range tests {
		t.Run(tt.terminal, func(t *testing.T) {
			t.Parallel()
			src := `
kind: Workflow
name: ends
version: "1"
terminals:
  Shipped: {status: completed}
  Rejected: {status: failed}
  Withdrawn: {status: cancelled}
  Expired: {status: timed_out}
start:
  run: "@actions/a"
  transitions:
    success: ` + tt.terminal + "\n"
			s := newSim(t, src, `{}`)
			s.start()
			eff := s.end("success", `{}`)
			require.True(t, eff.Ended)
			require.Equal(t, tt.wantStatus, s.run.Status)
			require.Equal(t, tt.terminal, s.run.Terminal)
			last := eff.History[len(eff.History)-1]
			require.Equal(t, tt.wantHistory, last.Type)
			require.Equal(t, tt.terminal, last.Detail)
			require.Equal(t, tt.wantStatus != StatusCompleted && tt.wantStatus != StatusCancelled, s.run.Error != "")
		})
	}
}

const signalFlow = `
kind: Workflow
name: signals
version: "1"
start:
  waitForSignal:
    type: go
  transitions:
    success: second
steps:
  second:
    waitForSignal:
      type: go
      timeoutMs: 60000
    transitions:
      success: flo.Completed
`

func TestSignals(t *testing.T) {
	t.Parallel()

	t.Run("a wait without timeout sets no timer", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, signalFlow, `{}`)
		eff := s.start()
		require.Empty(t, eff.Timers)
		require.True(t, s.run.Deadline.IsZero())
		require.Equal(t, StatusWaiting, s.run.Status)
		require.Equal(t, Effects{}, s.do(TimerFired{Token: s.run.Token}), "no timer belongs to this wait")
	})

	t.Run("each signal is matched once", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, signalFlow, `{}`)
		s.start()
		eff := s.signal("go", `{"n": 1}`)
		require.Equal(t, []string{"sig-1"}, eff.ConsumedSignals)
		require.Equal(t, "second", s.run.Step)
		require.Equal(t, WaitSignal, s.run.Wait, "the consumed signal is not matched again")
		require.Len(t, eff.Timers, 1)
		require.Equal(t, time.Minute, s.timerIn())

		// The same signal delivered again is recorded, not matched again.
		eff = s.do(SignalArrived{Signal: Signal{ID: "sig-1", Type: "go", Payload: raw(`{"n": 1}`)}})
		require.Equal(t, []string{"signal_received"}, historyTypes(eff.History))
		require.Empty(t, eff.ConsumedSignals)
		require.False(t, eff.ClearTimers)
		require.Equal(t, "second", s.run.Step)

		eff = s.signal("go", `{"n": 2}`)
		require.True(t, eff.Ended)
		require.True(t, eff.ClearTimers)
		require.JSONEq(t, `{"n": 2}`, string(s.run.Outputs["second"].Output))
		require.JSONEq(t, `{"n": 1}`, string(s.run.Outputs[StartStep].Output))
	})

	t.Run("signals sent before the start are matched oldest first", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, signalFlow, `{}`)
		s.signal("go", `{"n": 1}`)
		require.Equal(t, StatusPending, s.run.Status)
		s.signal("go", `{"n": 2}`)
		s.signal("go", `{"n": 3}`)
		eff := s.start()
		require.True(t, eff.Ended)
		require.Equal(t, []string{"sig-1", "sig-2"}, eff.ConsumedSignals)
		require.JSONEq(t, `{"n": 1}`, string(s.run.Outputs[StartStep].Output))
		require.JSONEq(t, `{"n": 2}`, string(s.run.Outputs["second"].Output))
		require.Len(t, s.pending, 1)
	})

	t.Run("a timeout without onTimeout ends timed_out", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, signalFlow, `{}`)
		s.start()
		s.signal("go", `{}`)
		eff := s.fire()
		require.True(t, eff.Ended)
		require.Equal(t, StatusTimedOut, s.run.Status)
		require.Equal(t, "flo.TimedOut", s.run.Terminal)
		require.Equal(t, []string{"signal_timeout", "step_completed", "workflow_timed_out"}, historyTypes(eff.History))
		require.Equal(t, "flo.TimedOut", eff.History[0].Detail)
		require.Contains(t, eff.History[2].Detail, `no "go" signal within 1m0s`)
	})

	t.Run("onTimeout to a step", func(t *testing.T) {
		t.Parallel()
		src := `
kind: Workflow
name: remind
version: "1"
start:
  waitForSignal: {type: approval, timeoutMs: 1000, onTimeout: remind}
  transitions:
    success: flo.Completed
steps:
  remind:
    run: "@actions/send-reminder"
    transitions:
      success: _start
`
		s := newSim(t, src, `{}`)
		s.start()
		s.fire()
		require.Equal(t, "remind", s.run.Step)
		require.Equal(t, "send-reminder", s.lastInvoke().Action)
		s.end("success", `{}`)
		require.Equal(t, StartStep, s.run.Step)
		require.Equal(t, WaitSignal, s.run.Wait)
		eff := s.signal("approval", `{}`)
		require.True(t, eff.Ended)
	})
}

func TestCancel(t *testing.T) {
	t.Parallel()
	t.Run("from a signal wait", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, signalFlow, `{}`)
		s.start()
		s.signal("go", `{}`)
		require.Equal(t, "second", s.run.Step)
		eff := s.do(Cancel{Reason: "customer withdrew"})
		require.True(t, eff.Ended)
		require.True(t, eff.ClearTimers)
		require.Equal(t, StatusCancelled, s.run.Status)
		require.Equal(t, "flo.Cancelled", s.run.Terminal)
		require.Empty(t, s.run.Error)
		require.Equal(t, []HistoryEvent{{Type: "workflow_cancelled", Step: "second", Detail: "customer withdrew", Attempt: 1, At: s.now}}, eff.History)
		require.Equal(t, Effects{}, s.do(Cancel{Reason: "again"}), "an ended run stays as it ended")
		require.Equal(t, Effects{}, s.do(TimerFired{Token: s.run.Token}))
	})
	t.Run("from a task wait, then the task's end is ignored", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, processOrder, `{}`)
		s.start()
		token := s.run.Token
		eff := s.do(Cancel{})
		require.False(t, eff.ClearTimers)
		require.Equal(t, "cancelled", eff.History[0].Detail)
		require.Equal(t, Effects{}, s.do(TaskEnded{Token: token, Outcome: "success"}))
		require.Equal(t, StatusCancelled, s.run.Status)
	})
	t.Run("before the start", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, processOrder, `{}`)
		s.do(Cancel{Reason: "never mind"})
		require.Equal(t, StatusCancelled, s.run.Status)
		require.Equal(t, Effects{}, s.do(Started{}))
	})
}

func TestStaleEvents(t *testing.T) {
	t.Parallel()
	s := newSim(t, processOrder, `{}`)
	s.start()
	first := s.run.Token
	s.end("success", `{}`)
	s.fail("boom") // charge waits for its retry timer
	retry := s.run.Token
	stale := []any{
		Started{},
		TaskEnded{Token: first, Outcome: "success"},
		TaskEnded{Token: retry, Outcome: "success"}, // the run waits for a timer, not a task
		TaskEnded{Token: "", Outcome: "success"},
		TimerFired{Token: first},
		TimerFired{Token: "nope"},
		ChildEnded{Token: retry, Status: StatusCompleted},
		&TimerFired{Token: first},
		(*TaskEnded)(nil),
	}
	for i, ev := range stale {
		before := cloneRun(*s.run)
		eff, err := Advance(s.def, s.run, ev, s.env())
		require.NoError(t, err, "event %d", i)
		require.Equal(t, Effects{}, eff, "event %d (%T)", i, ev)
		require.Equal(t, before, *s.run, "event %d (%T)", i, ev)
	}
	eff := s.do(&TimerFired{Token: retry})
	require.Len(t, eff.Invokes, 1, "pointer events work too")
}

func TestAdvanceErrors(t *testing.T) {
	t.Parallel()
	def := mustParse(t, processOrder)
	_, err := Advance(nil, &Run{}, Started{}, Env{})
	require.Error(t, err)
	_, err = Advance(def, nil, Started{}, Env{})
	require.Error(t, err)
	_, err = Advance(def, &Run{ID: "r", Workflow: "other"}, Started{}, Env{})
	require.ErrorContains(t, err, `belongs to workflow "other"`)
	_, err = Advance(def, &Run{ID: "r"}, "started", Env{})
	require.ErrorContains(t, err, "unknown event string")
}

func TestCorruptStepFailsTheRun(t *testing.T) {
	t.Parallel()
	s := newSim(t, processOrder, `{}`)
	s.start()
	s.run.Step = "gone"
	eff := s.end("success", `{}`)
	require.True(t, eff.Ended)
	require.Contains(t, s.run.Error, `step "gone"`)
}

func TestAdvanceGuard(t *testing.T) {
	t.Parallel()
	t.Run("steps that fail their mapping in a loop", func(t *testing.T) {
		t.Parallel()
		src := `
kind: Workflow
name: loop
version: "1"
start:
  run: "@actions/a"
  inputMapping: '{"x": "$.input.missing"}'
  transitions:
    success: flo.Completed
    failure: other
steps:
  other:
    run: "@actions/b"
    inputMapping: '{"x": "$.input.missing"}'
    transitions:
      success: flo.Completed
      failure: _start
`
		s := newSim(t, src, `{}`)
		eff := s.start()
		require.True(t, eff.Ended)
		require.Equal(t, StatusFailed, s.run.Status)
		require.Contains(t, s.run.Error, "more than 256 steps in one advance")
		require.Equal(t, MaxAdvanceSteps, countType(eff.History, "step_started"))
		require.Empty(t, eff.Invokes)
	})
	t.Run("a signal loop fed by many stored signals", func(t *testing.T) {
		t.Parallel()
		src := `
kind: Workflow
name: loop
version: "1"
start:
  waitForSignal: {type: tick}
  transitions:
    success: _start
`
		s := newSim(t, src, `{}`)
		for i := 0; i < 300; i++ {
			s.pending = append(s.pending, Signal{ID: "s" + strconv.Itoa(i), Type: "tick", Payload: json.RawMessage(`{}`)})
		}
		eff := s.start()
		require.True(t, eff.Ended)
		require.Len(t, eff.ConsumedSignals, MaxAdvanceSteps)
		require.Contains(t, s.run.Error, "more than 256 steps")
	})
	t.Run("fewer steps pass", func(t *testing.T) {
		t.Parallel()
		src := `
kind: Workflow
name: loop
version: "1"
start:
  waitForSignal: {type: tick}
  transitions:
    success: _start
`
		s := newSim(t, src, `{}`)
		for i := 0; i < MaxAdvanceSteps-1; i++ {
			s.pending = append(s.pending, Signal{ID: "s" + strconv.Itoa(i), Type: "tick"})
		}
		eff := s.start()
		require.False(t, eff.Ended)
		require.Equal(t, WaitSignal, s.run.Wait)
		require.Len(t, eff.ConsumedSignals, MaxAdvanceSteps-1)
	})
}

func TestDeterministic(t *testing.T) {
	t.Parallel()
	def := mustParse(t, childFlow)
	run := Run{ID: "run-9", Workflow: "parent", Status: StatusPending, Input: raw(`{}`)}
	env := Env{Now: t0, NewID: func() string { return "c" }}
	a, b := cloneRun(run), cloneRun(run)
	e1, err := Advance(def, &a, Started{}, env)
	require.NoError(t, err)
	e2, err := Advance(def, &b, Started{}, env)
	require.NoError(t, err)
	require.Equal(t, e1, e2)
	require.Equal(t, a, b)

	// Without NewID a child's id is derived like a task id.
	c := cloneRun(run)
	e3, err := Advance(def, &c, Started{}, Env{Now: t0})
	require.NoError(t, err)
	require.Equal(t, TaskID("run-9", StartStep, c.Token+"/child"), e3.Children[0].RunID)
}

func TestTaskIDsAndOrigins(t *testing.T) {
	t.Parallel()
	id := TaskID("run-1", "charge", "3")
	require.Equal(t, id, TaskID("run-1", "charge", "3"))
	require.NotEqual(t, id, TaskID("run-1", "charge", "4"))
	require.NotEqual(t, id, TaskID("run-2", "charge", "3"))
	require.Len(t, id, 36)

	runID, token, ok := ParseOrigin(Origin("run-1", "3"))
	require.True(t, ok)
	require.Equal(t, "run-1", runID)
	require.Equal(t, "3", token)
	for _, bad := range []string{"", "workflow:", "workflow:run", "workflow::3", "workflow:run:", "other:run:3"} {
		_, _, ok := ParseOrigin(bad)
		require.False(t, ok, bad)
	}
}

func TestEmptyOutcomeIsSuccess(t *testing.T) {
	t.Parallel()
	s := newSim(t, processOrder, `{}`)
	s.start()
	s.end("", `{}`)
	require.Equal(t, "charge", s.run.Step)
}

func TestAdvanceDoesNotShareOutputs(t *testing.T) {
	t.Parallel()
	s := newSim(t, processOrder, `{}`)
	s.start()
	before := cloneRun(*s.run)
	held := s.run.Outputs
	s.end("success", `{}`)
	require.Equal(t, before.Outputs, held, "a map the caller held before the call is not written")
}

func TestDefinitionWithoutStartFailsTheRun(t *testing.T) {
	t.Parallel()
	run := &Run{ID: "r", Status: StatusPending}
	eff, err := Advance(&definition.Definition{Name: "empty", Version: "1"}, run, Started{}, Env{Now: t0})
	require.NoError(t, err)
	require.True(t, eff.Ended)
	require.Equal(t, StatusFailed, run.Status)
	require.Contains(t, run.Error, `"_start" is neither a step nor a terminal of workflow empty version 1`)
}

// A run whose task's result is pending shows as waiting until the task ends,
// and a pending answer for another task changes nothing.
func TestTaskWaiting(t *testing.T) {
	t.Parallel()
	s := newSim(t, processOrder, `{}`)
	s.start()
	token := s.run.Token
	for _, ev := range []any{TaskWaiting{Token: "nope"}, (*TaskWaiting)(nil)} {
		before := cloneRun(*s.run)
		eff, err := Advance(s.def, s.run, ev, s.env())
		require.NoError(t, err)
		require.Equal(t, Effects{}, eff)
		require.Equal(t, before, *s.run)
	}
	eff := s.do(&TaskWaiting{Token: token})
	require.Equal(t, StatusWaiting, s.run.Status)
	require.Equal(t, WaitTask, s.run.Wait)
	require.Len(t, eff.History, 1)
	require.Equal(t, HistoryActionWaiting, eff.History[0].Type)
	require.Empty(t, eff.Invokes)
	require.Equal(t, Effects{}, s.do(TaskWaiting{Token: token}), "a repeated answer changes nothing")

	s.end("success", `{}`)
	require.Equal(t, StatusRunning, s.run.Status)
	require.Equal(t, "charge", s.run.Step)
}
