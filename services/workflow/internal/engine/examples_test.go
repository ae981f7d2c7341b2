package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// processOrder is the reference's first example.
const processOrder = `
kind: Workflow
name: process-order
version: "1.0.0"
idempotency: required
start:
  run: "@actions/validate-order"
  transitions:
    success: charge
    failure: flo.Failed
steps:
  charge:
    run: "@actions/charge-payment"
    retry:
      max_attempts: 3
      backoff: exponential
      initial_delay_ms: 1000
      max_delay_ms: 30000
    transitions:
      success: ship
      failure: flo.Failed
  ship:
    run: "@actions/create-shipment"
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// orderProcessing is the reference's "Order Processing with Signals".
const orderProcessing = `
kind: Workflow
name: order-processing
version: "1.0.0"
idempotency: required
terminals:
  OrderCompleted:
    status: completed
  OrderRejected:
    status: failed
  PaymentFailed:
    status: failed
start:
  run: "@actions/validate-order"
  transitions:
    success: process_payment
    failure: flo.Failed
steps:
  process_payment:
    run: "@actions/charge-payment"
    retry:
      max_attempts: 3
      backoff: exponential
      initial_delay_ms: 1000
    transitions:
      success: check_approval
      failure: PaymentFailed
  check_approval:
    run: "@actions/check-approval-needed"
    transitions:
      success: fulfill # no approval needed
      failure: await_approval # high-value order, needs approval
  await_approval:
    waitForSignal:
      type: approval
      timeoutMs: 3600000 # 1 hour
      onTimeout: OrderRejected
    transitions:
      success: fulfill
  fulfill:
    run: "@actions/ship-order"
    transitions:
      success: OrderCompleted
      failure: flo.Failed
`

const orderInput = `{"order_id": "ORD-123", "amount": 99.99}`

func TestProcessOrder(t *testing.T) {
	t.Parallel()
	s := newSim(t, processOrder, orderInput)

	eff := s.start()
	require.Equal(t, StatusRunning, s.run.Status)
	require.Equal(t, StartStep, s.run.Step)
	require.Equal(t, WaitTask, s.run.Wait)
	require.Len(t, eff.Invokes, 1)
	validate := eff.Invokes[0]
	require.Equal(t, "validate-order", validate.Action)
	require.JSONEq(t, orderInput, string(validate.Payload), "without inputMapping a step gets the run's input")
	require.Equal(t, int32(0), validate.MaxAttempts, "no retry block: the action's own policy governs")
	require.Equal(t, "workflow:run-1:"+s.run.Token, validate.Origin)
	require.Equal(t, TaskID("run-1", StartStep, s.run.Token), validate.TaskID)

	s.now = s.now.Add(time.Second)
	eff = s.end("success", `{"valid": true}`)
	require.Equal(t, "charge", s.run.Step)
	require.Len(t, eff.Invokes, 1)
	charge := eff.Invokes[0]
	require.Equal(t, "charge-payment", charge.Action)
	require.Equal(t, int32(1), charge.MaxAttempts, "a retry block: one attempt per task, the step retries")
	require.NotEqual(t, validate.TaskID, charge.TaskID)

	// Two failures, retried after 1 s and 2 s, then success.
	eff = s.fail("card declined")
	require.Equal(t, StatusWaiting, s.run.Status)
	require.Equal(t, WaitRetry, s.run.Wait)
	require.Equal(t, 2, s.run.Attempt)
	require.Empty(t, eff.Invokes)
	require.Equal(t, time.Second, s.timerIn())
	require.Equal(t, WaitRetry, s.timers[0].Kind)
	eff = s.fire()
	require.Len(t, eff.Invokes, 1)
	require.Equal(t, StatusRunning, s.run.Status)
	require.NotEqual(t, charge.TaskID, eff.Invokes[0].TaskID, "every attempt is its own task")
	s.fail("card declined")
	require.Equal(t, 2*time.Second, s.timerIn())
	require.Equal(t, 3, s.run.Attempt)
	s.fire()
	eff = s.end("success", `{"payment_id": "pay-1"}`)
	require.Equal(t, "ship", s.run.Step)
	require.Equal(t, 1, s.run.Attempt, "attempts start again in a new step")
	require.Equal(t, "create-shipment", eff.Invokes[0].Action)
	require.False(t, eff.ClearTimers, "the retry timer already fired and no other was set")

	eff = s.end("success", `{"tracking": "TRK-9"}`)
	require.True(t, eff.Ended)
	require.Equal(t, StatusCompleted, s.run.Status)
	require.Equal(t, "flo.Completed", s.run.Terminal)
	require.Equal(t, s.now, s.run.FinishedAt)
	require.Empty(t, s.run.Error)
	require.Equal(t, StepResult{Outcome: "success", Output: raw(`{"payment_id": "pay-1"}`), Attempts: 3, FinishedAt: s.run.Outputs["charge"].FinishedAt}, s.run.Outputs["charge"])
	require.Len(t, s.run.Outputs, 3)

	require.Equal(t, []string{
		"workflow_started",
		"step_started", "awaiting_action", "action_completed", "step_completed",
		"step_started", "awaiting_action", "action_completed", "step_retry",
		"awaiting_action", "action_completed", "step_retry",
		"awaiting_action", "action_completed", "step_completed",
		"step_started", "awaiting_action", "action_completed", "step_completed",
		"workflow_completed",
	}, s.types())
	require.Equal(t, orderInput, s.history[0].Detail)
	require.Equal(t, "flo.Completed", s.history[len(s.history)-1].Detail)
	require.Len(t, s.invokes, 5)
	seen := map[string]bool{}
	for _, in := range s.invokes {
		require.False(t, seen[in.TaskID], "task id %s reused", in.TaskID)
		seen[in.TaskID] = true
	}
}

func TestProcessOrderPaymentFails(t *testing.T) {
	t.Parallel()
	s := newSim(t, processOrder, orderInput)
	s.start()
	s.end("success", `{}`)
	for i := 0; i < 2; i++ {
		s.fail("card declined")
		s.fire()
	}
	eff := s.fail("card declined")
	require.True(t, eff.Ended)
	require.Equal(t, StatusFailed, s.run.Status)
	require.Equal(t, "flo.Failed", s.run.Terminal)
	require.Equal(t, 3, s.run.Outputs["charge"].Attempts)
	require.Equal(t, "card declined", s.run.Outputs["charge"].Error)
	require.Contains(t, s.run.Error, `step "charge" ended with outcome "failure": card declined`)
	require.Equal(t, []string{"action_completed", "step_completed", "workflow_failed"}, historyTypes(eff.History))
	require.Len(t, s.invokes, 4)
}

func TestOrderProcessingWithSignals(t *testing.T) {
	t.Parallel()
	// toApproval walks a run to the point where check_approval's task runs.
	toApproval := func(t *testing.T) *sim {
		s := newSim(t, orderProcessing, orderInput)
		s.start()
		s.end("success", `{}`)
		require.Equal(t, "process_payment", s.run.Step)
		s.end("success", `{"payment_id": "pay-1"}`)
		require.Equal(t, "check_approval", s.run.Step)
		require.Equal(t, "check-approval-needed", s.lastInvoke().Action)
		return s
	}

	t.Run("no approval needed", func(t *testing.T) {
		t.Parallel()
		s := toApproval(t)
		s.end("success", `{}`)
		require.Equal(t, "fulfill", s.run.Step)
		eff := s.end("success", `{}`)
		require.True(t, eff.Ended)
		require.Equal(t, StatusCompleted, s.run.Status)
		require.Equal(t, "OrderCompleted", s.run.Terminal)
		require.Equal(t, "workflow_completed", s.history[len(s.history)-1].Type)
		require.Equal(t, "OrderCompleted", s.history[len(s.history)-1].Detail)
	})

	t.Run("approved while waiting", func(t *testing.T) {
		t.Parallel()
		s := toApproval(t)
		eff := s.fail("")
		require.Equal(t, "await_approval", s.run.Step)
		require.Equal(t, StatusWaiting, s.run.Status)
		require.Equal(t, WaitSignal, s.run.Wait)
		require.Equal(t, "approval", s.run.WaitingFor)
		require.Equal(t, s.now.Add(time.Hour), s.run.Deadline)
		require.Equal(t, []Timer{{Token: s.run.Token, At: s.now.Add(time.Hour), Kind: WaitSignal}}, eff.Timers)
		require.Equal(t, []string{"action_completed", "step_completed", "step_started", "waiting_for_signal"}, historyTypes(eff.History))

		s.now = s.now.Add(10 * time.Minute)
		eff = s.signal("other", `{}`)
		require.Equal(t, []string{"signal_received"}, historyTypes(eff.History), "another type is kept, not matched")
		require.Empty(t, eff.ConsumedSignals)
		require.Equal(t, WaitSignal, s.run.Wait)
		require.Len(t, s.timers, 1, "the timeout stays")

		eff = s.signal("approval", `{"decision": "approved", "approver": "manager@co.com"}`)
		require.Equal(t, []string{"sig-2"}, eff.ConsumedSignals)
		require.True(t, eff.ClearTimers, "the signal timeout goes")
		require.Equal(t, []string{"signal_received", "signal_matched", "step_completed", "step_started", "awaiting_action"}, historyTypes(eff.History))
		require.Equal(t, "approval", eff.History[1].Detail)
		require.JSONEq(t, `{"decision": "approved", "approver": "manager@co.com"}`, string(s.run.Outputs["await_approval"].Output))
		require.Equal(t, "ship-order", eff.Invokes[0].Action)
		require.Equal(t, StatusRunning, s.run.Status)
		require.True(t, s.run.Deadline.IsZero())

		eff = s.end("success", `{}`)
		require.Equal(t, "OrderCompleted", s.run.Terminal)
		require.Len(t, s.pending, 1, "the unmatched signal stays stored")
		require.Equal(t, "other", s.pending[0].Type)
	})

	t.Run("signal before the step waits", func(t *testing.T) {
		t.Parallel()
		s := toApproval(t)
		eff := s.signal("approval", `{"decision": "approved"}`)
		require.Equal(t, []string{"signal_received"}, historyTypes(eff.History))
		require.Empty(t, eff.ConsumedSignals)
		require.Equal(t, "check_approval", s.run.Step, "the run keeps waiting for its task")
		require.Equal(t, WaitTask, s.run.Wait)

		eff = s.fail("needs approval")
		require.Equal(t, []string{"sig-1"}, eff.ConsumedSignals)
		require.Equal(t, []string{"action_completed", "step_completed", "step_started", "signal_matched", "step_completed", "step_started", "awaiting_action"}, historyTypes(eff.History))
		require.Equal(t, "fulfill", s.run.Step)
		require.Empty(t, eff.Timers, "a matched signal sets no timeout")
		require.Empty(t, s.pending)
		s.end("success", `{}`)
		require.Equal(t, StatusCompleted, s.run.Status)
	})

	t.Run("timeout to OrderRejected", func(t *testing.T) {
		t.Parallel()
		s := toApproval(t)
		s.fail("")
		eff := s.fire()
		require.Equal(t, s.run.FinishedAt, t0.Add(time.Hour))
		require.True(t, eff.Ended)
		require.Equal(t, StatusFailed, s.run.Status)
		require.Equal(t, "OrderRejected", s.run.Terminal)
		require.Equal(t, []string{"signal_timeout", "step_completed", "workflow_failed"}, historyTypes(eff.History))
		require.Equal(t, "OrderRejected", eff.History[0].Detail)
		require.Equal(t, "timeout", s.run.Outputs["await_approval"].Outcome)
		require.Contains(t, s.run.Error, `no "approval" signal within 1h0m0s`)

		// A late approval changes nothing.
		eff = s.signal("approval", `{}`)
		require.Equal(t, Effects{}, eff)
	})

	t.Run("payment fails", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, orderProcessing, orderInput)
		s.start()
		s.end("success", `{}`)
		s.fail("declined")
		require.Equal(t, time.Second, s.timerIn())
		s.fire()
		s.fail("declined")
		require.Equal(t, 2*time.Second, s.timerIn())
		s.fire()
		eff := s.fail("declined")
		require.True(t, eff.Ended)
		require.Equal(t, "PaymentFailed", s.run.Terminal)
		require.Equal(t, StatusFailed, s.run.Status)
		require.Equal(t, "PaymentFailed", eff.History[len(eff.History)-1].Detail)
	})
}
