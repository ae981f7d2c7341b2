package service_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

const (
	stCompleted = flov1.RunStatus_RUN_STATUS_COMPLETED
	stFailed    = flov1.RunStatus_RUN_STATUS_FAILED
	stCancelled = flov1.RunStatus_RUN_STATUS_CANCELLED
	stTimedOut  = flov1.RunStatus_RUN_STATUS_TIMED_OUT
)

// TestWorkflow runs the behaviour tests against one workflow service and one
// dispatcher; each subtest owns a namespace, so they run in parallel.
func TestWorkflow(t *testing.T) {
	e := startEnv(t)
	t.Run("process order", func(t *testing.T) { t.Parallel(); testProcessOrder(t, e) })
	t.Run("approval signal", func(t *testing.T) { t.Parallel(); testApprovalSignal(t, e) })
	t.Run("signal before wait", func(t *testing.T) { t.Parallel(); testSignalBeforeWait(t, e) })
	t.Run("signal timeout", func(t *testing.T) { t.Parallel(); testSignalTimeout(t, e) })
	t.Run("retries", func(t *testing.T) { t.Parallel(); testRetries(t, e) })
	t.Run("poll", func(t *testing.T) { t.Parallel(); testPoll(t, e) })
	t.Run("outcomes", func(t *testing.T) { t.Parallel(); testOutcomes(t, e) })
	t.Run("children", func(t *testing.T) { t.Parallel(); testChildren(t, e) })
	t.Run("idempotency disable cancel", func(t *testing.T) { t.Parallel(); testIdempotencyDisableCancel(t, e) })
	t.Run("definitions", func(t *testing.T) { t.Parallel(); testDefinitions(t, e) })
	t.Run("list runs", func(t *testing.T) { t.Parallel(); testListRuns(t, e) })
	t.Run("bad input", func(t *testing.T) { t.Parallel(); testBadInput(t, e) })
}

// testProcessOrder runs the reference's first example with a charge that
// fails once: the step's own retry takes it, and history shows each
// transition once.
func testProcessOrder(t *testing.T, e *env) {
	ns := e.namespace(t)
	var charges atomic.Int32
	e.worker(t, ns, script{
		"validate-order": func(*flov1.TaskAssignment) reply { return ok(`{"valid":true}`) },
		"charge-payment": func(*flov1.TaskAssignment) reply {
			if charges.Add(1) == 1 {
				return reply{fail: "card network timeout", retry: true}
			}
			return ok(`{"payment_id":"pay-1"}`)
		},
		"create-shipment": func(*flov1.TaskAssignment) reply { return ok(`{"tracking":"TRK-9"}`) },
	})
	created := e.create(t, ns, processOrderYAML)
	require.Equal(t, "process-order", created.GetWorkflow().GetName())

	id := e.start(t, ns, "process-order", `{"order_id":"ORD-123","amount":99.99}`, "order-123")
	again, err := e.client().StartRun(t.Context(), &flov1.StartRunRequest{
		Namespace: ns, Workflow: "process-order", Input: []byte(`{"order_id":"ORD-123"}`), IdempotencyKey: "order-123",
	})
	require.NoError(t, err)
	require.Equal(t, id, again.GetRunId(), "same key, same run")
	require.False(t, again.GetCreated())

	run := e.waitRun(t, ns, id, stCompleted)
	require.Equal(t, "flo.Completed", run.GetTerminal())
	require.Equal(t, "1.0.0", run.GetVersion())
	require.Empty(t, run.GetCurrentStep())
	require.Equal(t, "order-123", run.GetIdempotencyKey())
	require.NotNil(t, run.GetFinishedAt())
	require.Equal(t, "ORD-123", run.GetInputValue().GetStructValue().GetFields()["order_id"].GetStringValue())
	var steps []string
	for _, o := range run.GetOutputs() {
		steps = append(steps, o.GetStep())
		require.Equal(t, "success", o.GetOutcome())
	}
	require.Equal(t, []string{"_start", "charge", "ship"}, steps, "outputs in the order the steps finished")
	require.Equal(t, int32(2), run.GetOutputs()[1].GetAttempts())
	require.Equal(t, "TRK-9", run.GetOutputs()[2].GetOutputValue().GetStructValue().GetFields()["tracking"].GetStringValue())
	require.JSONEq(t, `{"payment_id":"pay-1"}`, string(run.GetOutputs()[1].GetOutput()))

	require.Equal(t, []string{
		"workflow_started ",
		"step_started _start", "awaiting_action _start", "action_completed _start", "step_completed _start",
		"step_started charge", "awaiting_action charge", "action_completed charge", "step_retry charge",
		"awaiting_action charge", "action_completed charge", "step_completed charge",
		"step_started ship", "awaiting_action ship", "action_completed ship", "step_completed ship",
		"workflow_completed ship",
	}, historyTypes(e.history(t, ns, id)))

	// Started, waiting for the retry, running again, ended.
	evs := runEvents(t, e.brokers, id)
	require.Len(t, evs, 4)
	require.Equal(t, eventsv1.RunEventType_RUN_EVENT_TYPE_STARTED, evs[0].GetType())
	require.Equal(t, flov1.RunStatus_RUN_STATUS_RUNNING, evs[0].GetStatus())
	require.Equal(t, flov1.RunStatus_RUN_STATUS_WAITING, evs[1].GetStatus())
	require.Equal(t, flov1.RunStatus_RUN_STATUS_RUNNING, evs[2].GetStatus())
	require.Equal(t, stCompleted, evs[len(evs)-1].GetStatus())
	require.Equal(t, "flo.Completed", evs[len(evs)-1].GetTerminal())
}

// orderWorker scripts the order-processing actions: orders above 1000 need
// approval; ship-order's inputs are recorded by order id.
func orderWorker(t *testing.T, e *env, ns string, shipped *sync.Map, gate chan struct{}) {
	e.worker(t, ns, script{
		"validate-order": func(*flov1.TaskAssignment) reply {
			if gate != nil {
				<-gate
			}
			return ok(`{"valid":true}`)
		},
		"charge-payment": func(*flov1.TaskAssignment) reply { return ok(`{"payment_id":"pay-7"}`) },
		"check-approval-needed": func(task *flov1.TaskAssignment) reply {
			var in struct{ Amount float64 }
			_ = json.Unmarshal(task.GetPayload(), &in)
			if in.Amount > 1000 {
				return reply{fail: "approval needed"}
			}
			return ok(`{}`)
		},
		"ship-order": func(task *flov1.TaskAssignment) reply {
			var in struct {
				Order string `json:"order"`
			}
			_ = json.Unmarshal(task.GetPayload(), &in)
			shipped.Store(in.Order, string(task.GetPayload()))
			return ok(`{"shipped":true}`)
		},
	})
}

// testApprovalSignal: a high-value order waits for approval and completes
// when the signal comes; a low-value one never waits.
func testApprovalSignal(t *testing.T, e *env) {
	ns := e.namespace(t)
	var shipped sync.Map
	orderWorker(t, e, ns, &shipped, nil)
	e.create(t, ns, fmt.Sprintf(orderProcessingYAML, 3600000))

	big := e.start(t, ns, "order-processing", `{"order_id":"ORD-BIG","amount":5000}`, "big")
	small := e.start(t, ns, "order-processing", `{"order_id":"ORD-SMALL","amount":10}`, "small")

	run := e.waitWaiting(t, ns, big)
	require.Equal(t, "approval", run.GetWaitingFor())
	require.Equal(t, "await_approval", run.GetCurrentStep())
	e.signal(t, ns, big, "approval", `{"decision":"approved","approver":"manager@co.com"}`)
	run = e.waitRun(t, ns, big, stCompleted)
	require.Equal(t, "OrderCompleted", run.GetTerminal())
	payload, found := shipped.Load("ORD-BIG")
	require.True(t, found)
	require.JSONEq(t, `{"order":"ORD-BIG","payment":"pay-7"}`, payload.(string))
	require.JSONEq(t, `{"decision":"approved","approver":"manager@co.com"}`, string(stepOutput(t, run, "await_approval").GetOutput()),
		"the signal's payload is the step's output")
	hist := historyTypes(e.history(t, ns, big))
	require.Contains(t, hist, "waiting_for_signal await_approval")
	require.Contains(t, hist, "signal_received await_approval")
	require.Contains(t, hist, "signal_matched await_approval")
	require.Equal(t, "workflow_completed fulfill", hist[len(hist)-1])

	run = e.waitRun(t, ns, small, stCompleted)
	require.Equal(t, "OrderCompleted", run.GetTerminal())
	require.NotContains(t, historyTypes(e.history(t, ns, small)), "waiting_for_signal await_approval")
}

func stepOutput(t *testing.T, run *flov1.WorkflowRun, step string) *flov1.StepOutput {
	t.Helper()
	for _, o := range run.GetOutputs() {
		if o.GetStep() == step {
			return o
		}
	}
	t.Fatalf("run %s has no output of step %s", run.GetRunId(), step)
	return nil
}

// testSignalBeforeWait: an approval sent while the run is still validating is
// kept and matched when the run reaches the step, without waiting.
func testSignalBeforeWait(t *testing.T, e *env) {
	ns := e.namespace(t)
	var shipped sync.Map
	gate := make(chan struct{})
	orderWorker(t, e, ns, &shipped, gate)
	e.create(t, ns, fmt.Sprintf(orderProcessingYAML, 3600000))

	id := e.start(t, ns, "order-processing", `{"order_id":"ORD-EARLY","amount":5000}`, "early")
	e.signal(t, ns, id, "approval", `{"decision":"approved early"}`)
	close(gate)
	run := e.waitRun(t, ns, id, stCompleted)
	require.Equal(t, "OrderCompleted", run.GetTerminal())
	hist := historyTypes(e.history(t, ns, id))
	require.Equal(t, "signal_received _start", hist[3], "the signal arrived during validation: %v", hist)
	require.Contains(t, hist, "signal_matched await_approval")
	require.NotContains(t, hist, "waiting_for_signal await_approval")
	require.JSONEq(t, `{"decision":"approved early"}`, string(stepOutput(t, run, "await_approval").GetOutput()))
}

// testSignalTimeout: no approval within the timeout rejects the order.
func testSignalTimeout(t *testing.T, e *env) {
	ns := e.namespace(t)
	var shipped sync.Map
	orderWorker(t, e, ns, &shipped, nil)
	e.create(t, ns, fmt.Sprintf(orderProcessingYAML, 300))

	id := e.start(t, ns, "order-processing", `{"order_id":"ORD-LATE","amount":5000}`, "late")
	run := e.waitRun(t, ns, id, stFailed)
	require.Equal(t, "OrderRejected", run.GetTerminal())
	evs := e.history(t, ns, id)
	hist := historyTypes(evs)
	require.Contains(t, hist, "signal_timeout await_approval")
	require.Equal(t, "workflow_failed await_approval", hist[len(hist)-1])
	for _, ev := range evs {
		if ev.GetType() == "signal_timeout" {
			require.Equal(t, "OrderRejected", ev.GetDetail())
		}
	}
	_, err := e.client().SignalRun(t.Context(), &flov1.SignalRunRequest{Namespace: ns, RunId: id, Type: "approval"})
	requireCode(t, codes.FailedPrecondition, err, "has ended")

	// Without onTimeout the run itself times out.
	e.create(t, ns, `kind: Workflow
name: bare-timeout
version: "1"
start:
  waitForSignal:
    type: never
    timeoutMs: 100
  transitions:
    success: flo.Completed
`)
	id = e.start(t, ns, "bare-timeout", `{}`, "")
	run = e.waitRun(t, ns, id, stTimedOut)
	require.Equal(t, "flo.TimedOut", run.GetTerminal())
}

const retriesYAML = `kind: Workflow
name: retries
version: "1"
terminals:
  GaveUp:
    status: failed
start:
  run: "@actions/flaky"
  retry:
    max_attempts: 3
    backoff: linear
    initial_delay_ms: 20
  transitions:
    success: flo.Completed
    failure: GaveUp
`

const withinYAML = `kind: Workflow
name: within
version: "1"
start:
  run: "@actions/flaky"
  retry:
    max_attempts: 1000
    backoff: exponential_jitter
    initial_delay_ms: 20
    max_delay_ms: 40
    within_ms: 2000
  transitions:
    success: flo.Completed
    failure: flo.Failed
`

// flakyWorker fails each run's first fail_times attempts (counted by key).
func flakyWorker(t *testing.T, e *env, ns string) {
	var mu sync.Mutex
	attempts := map[string]int{}
	e.worker(t, ns, script{
		"flaky": func(task *flov1.TaskAssignment) reply {
			var in struct {
				Key          string
				FailTimes    int `json:"fail_times"`
				NonRetryable bool
			}
			_ = json.Unmarshal(task.GetPayload(), &in)
			mu.Lock()
			attempts[in.Key]++
			n := attempts[in.Key]
			mu.Unlock()
			if n <= in.FailTimes {
				return reply{fail: fmt.Sprintf("attempt %d failed", n), retry: true, nonRetryable: in.NonRetryable}
			}
			return ok(fmt.Sprintf(`{"attempt":%d}`, n))
		},
	})
}

func countTypes(hist []string, typ string) int {
	n := 0
	for _, h := range hist {
		if h == typ {
			n++
		}
	}
	return n
}

// testRetries: a step retries failures up to max_attempts; NonRetryable
// errors take the failure transition at once; within_ms stops retrying when
// the budget is spent. The budget is wide (2 s) so a first attempt slowed by a
// loaded machine still leaves room for a retry.
func testRetries(t *testing.T, e *env) {
	ns := e.namespace(t)
	flakyWorker(t, e, ns)
	e.create(t, ns, retriesYAML)
	e.create(t, ns, withinYAML)

	recovers := e.start(t, ns, "retries", `{"Key":"recovers","fail_times":2}`, "")
	exhausted := e.start(t, ns, "retries", `{"Key":"exhausted","fail_times":9}`, "")
	fatal := e.start(t, ns, "retries", `{"Key":"fatal","fail_times":9,"NonRetryable":true}`, "")
	budget := e.start(t, ns, "within", `{"Key":"budget","fail_times":1000}`, "")

	run := e.waitRun(t, ns, recovers, stCompleted)
	require.Equal(t, int32(3), run.GetOutputs()[0].GetAttempts())
	require.Equal(t, 2, countTypes(historyTypes(e.history(t, ns, recovers)), "step_retry _start"))

	run = e.waitRun(t, ns, exhausted, stFailed)
	require.Equal(t, "GaveUp", run.GetTerminal())
	require.Equal(t, int32(3), run.GetOutputs()[0].GetAttempts())
	require.Contains(t, run.GetError(), "attempt 3 failed")

	run = e.waitRun(t, ns, fatal, stFailed)
	require.Equal(t, "GaveUp", run.GetTerminal())
	require.Equal(t, int32(1), run.GetOutputs()[0].GetAttempts())
	require.Zero(t, countTypes(historyTypes(e.history(t, ns, fatal)), "step_retry _start"))

	run = e.waitRun(t, ns, budget, stFailed)
	attempts := run.GetOutputs()[0].GetAttempts()
	require.GreaterOrEqual(t, attempts, int32(2), "retried within the budget")
	require.Less(t, attempts, int32(1000), "stopped by within_ms, not max_attempts")
}

const pollYAML = `kind: Workflow
name: poll
version: "1"
terminals:
  PollTimedOut:
    status: failed
start:
  run: "@actions/status-check"
  poll:
    maxAttempts: 3
    backoff: constant
    initialDelayMs: 10
    baseDelayMs: 20
  transitions:
    success: flo.Completed
    timeout: PollTimedOut
`

// testPoll: pending outcomes re-run the step on the poll backoff until it
// succeeds, or take the timeout transition when polls run out.
func testPoll(t *testing.T, e *env) {
	ns := e.namespace(t)
	var mu sync.Mutex
	calls := map[string]int{}
	e.worker(t, ns, script{
		"status-check": func(task *flov1.TaskAssignment) reply {
			var in struct {
				Key     string
				Pending int
			}
			_ = json.Unmarshal(task.GetPayload(), &in)
			mu.Lock()
			calls[in.Key]++
			n := calls[in.Key]
			mu.Unlock()
			if n <= in.Pending {
				return reply{body: `{"state":"processing"}`, outcome: "pending"}
			}
			return ok(`{"state":"settled"}`)
		},
	})
	e.create(t, ns, pollYAML)
	settles := e.start(t, ns, "poll", `{"Key":"settles","Pending":2}`, "")
	never := e.start(t, ns, "poll", `{"Key":"never","Pending":100}`, "")

	run := e.waitRun(t, ns, settles, stCompleted)
	require.JSONEq(t, `{"state":"settled"}`, string(run.GetOutputs()[0].GetOutput()))
	require.Equal(t, 2, countTypes(historyTypes(e.history(t, ns, settles)), "poll_scheduled _start"))

	run = e.waitRun(t, ns, never, stFailed)
	require.Equal(t, "PollTimedOut", run.GetTerminal())
	require.Equal(t, "timeout", run.GetOutputs()[0].GetOutcome())
	require.Equal(t, 3, countTypes(historyTypes(e.history(t, ns, never)), "poll_scheduled _start"))
}

// testOutcomes: named outcomes match exactly; an unknown action takes the
// execution-level fallback chain; an outcome without a transition fails the
// run naming step and outcome.
func testOutcomes(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.worker(t, ns, script{
		"decide": func(task *flov1.TaskAssignment) reply {
			var in struct{ Outcome string }
			_ = json.Unmarshal(task.GetPayload(), &in)
			return reply{body: `"plain text is fine"`, outcome: in.Outcome}
		},
		"raw": func(*flov1.TaskAssignment) reply { return ok("not json at all") },
	})
	e.create(t, ns, `kind: Workflow
name: outcomes
version: "1"
terminals:
  Approved:
    status: completed
  Broken:
    status: failed
start:
  run: "@actions/decide"
  transitions:
    approved: Approved
    success: raw
    failure: flo.Failed
steps:
  raw:
    run: "@actions/raw"
    transitions:
      success: missing
  missing:
    run: "@actions/not-registered"
    transitions:
      success: flo.Completed
      execution_failure: Broken
`)
	approved := e.start(t, ns, "outcomes", `{"Outcome":"approved"}`, "")
	odd := e.start(t, ns, "outcomes", `{"Outcome":"odd"}`, "")
	fallback := e.start(t, ns, "outcomes", `{"Outcome":"success"}`, "")

	run := e.waitRun(t, ns, approved, stCompleted)
	require.Equal(t, "Approved", run.GetTerminal())

	run = e.waitRun(t, ns, odd, stFailed)
	require.Contains(t, run.GetError(), `step "_start" has no transition for outcome "odd"`)

	run = e.waitRun(t, ns, fallback, stFailed)
	require.Equal(t, "Broken", run.GetTerminal())
	require.Equal(t, "not json at all", run.GetOutputs()[1].GetOutputValue().GetStringValue(), "non-JSON results become JSON strings")
	require.Equal(t, "target_not_found", run.GetOutputs()[2].GetOutcome())
	require.Contains(t, historyTypes(e.history(t, ns, fallback)), "action_not_found missing")
}

// testChildren: a parent waits for its child; completed is success, any
// other end failure; a pinned version runs that version; a missing child
// workflow fails the step; cancelling a parent cancels its child.
func testChildren(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.worker(t, ns, script{
		"child-work": func(*flov1.TaskAssignment) reply { return ok(`{"child":"done"}`) },
		"child-fail": func(*flov1.TaskAssignment) reply { return reply{fail: "child broke"} },
	})
	e.create(t, ns, `kind: Workflow
name: child
version: "1"
start:
  run: "@actions/child-work"
  transitions:
    success: flo.Completed
`)
	e.create(t, ns, `kind: Workflow
name: child
version: "2"
start:
  run: "@actions/child-fail"
  transitions:
    success: flo.Completed
    failure: flo.Failed
`)
	parent := func(name, target string) string {
		return fmt.Sprintf(`kind: Workflow
name: %s
version: "1"
terminals:
  ParentFailed:
    status: failed
start:
  run: "%s"
  inputMapping: '{"from_parent": "$.input.n"}'
  transitions:
    success: flo.Completed
    failure: ParentFailed
`, name, target)
	}
	e.create(t, ns, parent("parent-latest", "@workflow/child"))
	e.create(t, ns, parent("parent-pinned", "@workflow/child:1"))
	e.create(t, ns, parent("parent-missing", "@workflow/nope"))
	e.create(t, ns, fmt.Sprintf(waitYAML, "waiter", "1"))
	e.create(t, ns, parent("parent-waits", "@workflow/waiter"))

	latest := e.start(t, ns, "parent-latest", `{"n":1}`, "")
	pinned := e.start(t, ns, "parent-pinned", `{"n":2}`, "")
	missing := e.start(t, ns, "parent-missing", `{"n":3}`, "")
	waits := e.start(t, ns, "parent-waits", `{"n":4}`, "")

	run := e.waitRun(t, ns, latest, stFailed)
	require.Equal(t, "ParentFailed", run.GetTerminal())
	require.Contains(t, run.GetError(), "child workflow @workflow/child ended failed")

	run = e.waitRun(t, ns, pinned, stCompleted)
	require.JSONEq(t, `{"child":"done"}`, string(run.GetOutputs()[0].GetOutput()), "the child's output is the step's")
	children := listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, Workflow: "child"})
	require.Len(t, children, 2)
	versions := map[string]string{}
	for _, c := range children {
		versions[c.GetParentRunId()] = c.GetVersion()
		require.JSONEq(t, fmt.Sprintf(`{"from_parent":%d}`, map[string]int{latest: 1, pinned: 2}[c.GetParentRunId()]), string(c.GetInput()))
	}
	require.Equal(t, map[string]string{latest: "2", pinned: "1"}, versions)

	run = e.waitRun(t, ns, missing, stFailed)
	require.Equal(t, "ParentFailed", run.GetTerminal())
	require.Contains(t, run.GetError(), "workflow nope not found")

	var child *flov1.WorkflowRun
	require.Eventually(t, func() bool {
		cs := listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, Workflow: "waiter"})
		if len(cs) == 1 {
			child = cs[0]
		}
		return child != nil && child.GetWaitingFor() == "go"
	}, waitFor, tick)
	require.Equal(t, waits, child.GetParentRunId())
	_, err := e.client().CancelRun(t.Context(), &flov1.CancelRunRequest{Namespace: ns, RunId: waits, Reason: "changed my mind"})
	require.NoError(t, err)
	e.waitRun(t, ns, waits, stCancelled)
	run = e.waitRun(t, ns, child.GetRunId(), stCancelled)
	require.Equal(t, "flo.Cancelled", run.GetTerminal())
}

// testIdempotencyDisableCancel: keys name one run; a disabled workflow
// refuses starts while its runs go on; a waiting run can be cancelled.
func testIdempotencyDisableCancel(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.create(t, ns, fmt.Sprintf(waitYAML, "gate", "1"))
	e.create(t, ns, processOrderYAML)
	e.create(t, ns, fmt.Sprintf(threeStepYAML, "plain"))

	first := e.start(t, ns, "gate", `{}`, "k1")
	resp, err := e.client().StartRun(t.Context(), &flov1.StartRunRequest{Namespace: ns, Workflow: "gate", IdempotencyKey: "k1"})
	require.NoError(t, err)
	require.Equal(t, first, resp.GetRunId())
	require.False(t, resp.GetCreated())
	second := e.start(t, ns, "gate", `{}`, "")
	require.NotEqual(t, first, second)

	// Concurrent starts with one key create one run.
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Go(func() {
			resp, err := e.client().StartRun(t.Context(), &flov1.StartRunRequest{Namespace: ns, Workflow: "gate", IdempotencyKey: "race"})
			if err == nil {
				ids[i] = resp.GetRunId()
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		require.Equal(t, ids[0], id)
	}

	_, err = e.client().StartRun(t.Context(), &flov1.StartRunRequest{Namespace: ns, Workflow: "process-order"})
	requireCode(t, codes.InvalidArgument, err, "requires an idempotency key")
	_, err = e.client().StartRun(t.Context(), &flov1.StartRunRequest{Namespace: ns, Workflow: "plain", IdempotencyKey: "x"})
	requireCode(t, codes.InvalidArgument, err, "takes no idempotency key")

	def, err := e.client().DisableWorkflow(t.Context(), &flov1.WorkflowNameRequest{Namespace: ns, Name: "gate"})
	require.NoError(t, err)
	require.False(t, def.GetEnabled())
	_, err = e.client().StartRun(t.Context(), &flov1.StartRunRequest{Namespace: ns, Workflow: "gate"})
	requireCode(t, codes.FailedPrecondition, err, "workflow gate is disabled")
	e.waitWaiting(t, ns, first)
	e.signal(t, ns, first, "go", `{"ok":true}`)
	run := e.waitRun(t, ns, first, stCompleted)
	require.JSONEq(t, `{"ok":true}`, string(run.GetOutputs()[0].GetOutput()), "running runs go on while disabled")
	def, err = e.client().EnableWorkflow(t.Context(), &flov1.WorkflowNameRequest{Namespace: ns, Name: "gate"})
	require.NoError(t, err)
	require.True(t, def.GetEnabled())
	e.start(t, ns, "gate", `{}`, "")

	e.waitWaiting(t, ns, second)
	cancelled, err := e.client().CancelRun(t.Context(), &flov1.CancelRunRequest{Namespace: ns, RunId: second, Reason: "no longer needed"})
	require.NoError(t, err)
	require.Equal(t, stCancelled, cancelled.GetStatus())
	require.Equal(t, "flo.Cancelled", cancelled.GetTerminal())
	again, err := e.client().CancelRun(t.Context(), &flov1.CancelRunRequest{Namespace: ns, RunId: second})
	require.NoError(t, err, "cancelling twice is harmless")
	require.Equal(t, stCancelled, again.GetStatus())
	hist := e.history(t, ns, second)
	last := hist[len(hist)-1]
	require.Equal(t, "workflow_cancelled", last.GetType())
	require.Contains(t, last.GetDetail(), "no longer needed")
	_, err = e.client().CancelRun(t.Context(), &flov1.CancelRunRequest{Namespace: ns, RunId: first})
	requireCode(t, codes.FailedPrecondition, err, "already ended")
}

// testDefinitions: validation is a dry run; versions live side by side and
// the latest is the most recently created; invalid YAML stores nothing.
func testDefinitions(t *testing.T, e *env) {
	ns := e.namespace(t)
	c := e.client()
	v, err := c.ValidateWorkflow(t.Context(), &flov1.ValidateWorkflowRequest{Namespace: ns, Yaml: fmt.Sprintf(waitYAML, "defs", "2.0")})
	require.NoError(t, err)
	require.True(t, v.GetValid())
	require.Equal(t, "defs", v.GetWorkflow().GetName())
	require.Equal(t, "waitForSignal:go", v.GetWorkflow().GetStartTarget())
	require.Len(t, v.GetDiagnostics(), 1)
	require.Equal(t, "W501", v.GetDiagnostics()[0].GetCode())
	require.Equal(t, flov1.DiagnosticSeverity_DIAGNOSTIC_SEVERITY_WARNING, v.GetDiagnostics()[0].GetSeverity())
	_, err = c.GetWorkflow(t.Context(), &flov1.GetWorkflowRequest{Namespace: ns, Name: "defs"})
	requireCode(t, codes.NotFound, err, "workflow defs not found")

	v, err = c.ValidateWorkflow(t.Context(), &flov1.ValidateWorkflowRequest{Namespace: ns, Yaml: "kind: Workflow\nname: x\n"})
	require.NoError(t, err)
	require.False(t, v.GetValid())
	require.Nil(t, v.GetWorkflow())
	require.NotEmpty(t, v.GetDiagnostics())

	// "2.0" first, then "10": the latest is the one created last.
	created := e.create(t, ns, fmt.Sprintf(waitYAML, "defs", "2.0"))
	require.Equal(t, "W501", created.GetWarnings()[0].GetCode())
	require.True(t, created.GetWorkflow().GetLatest())
	require.True(t, created.GetWorkflow().GetEnabled())
	e.create(t, ns, fmt.Sprintf(waitYAML, "defs", "10"))
	latest, err := c.GetWorkflow(t.Context(), &flov1.GetWorkflowRequest{Namespace: ns, Name: "defs"})
	require.NoError(t, err)
	require.Equal(t, "10", latest.GetVersion())
	require.True(t, latest.GetLatest())
	require.Equal(t, "optional", latest.GetIdempotency())
	older, err := c.GetWorkflow(t.Context(), &flov1.GetWorkflowRequest{Namespace: ns, Name: "defs", Version: "2.0"})
	require.NoError(t, err)
	require.False(t, older.GetLatest())
	require.Contains(t, older.GetYaml(), `version: "2.0"`)
	_, err = c.GetWorkflow(t.Context(), &flov1.GetWorkflowRequest{Namespace: ns, Name: "defs", Version: "3"})
	requireCode(t, codes.NotFound, err, "workflow defs version 3 not found")

	_, err = c.CreateWorkflow(t.Context(), &flov1.CreateWorkflowRequest{Namespace: ns, Yaml: fmt.Sprintf(waitYAML, "defs", "2.0")})
	requireCode(t, codes.AlreadyExists, err, "already exists")

	e.create(t, ns, fmt.Sprintf(threeStepYAML, "another"))
	list, err := c.ListWorkflows(t.Context(), &flov1.ListWorkflowsRequest{Namespace: ns})
	require.NoError(t, err)
	require.Len(t, list.GetWorkflows(), 2)
	require.Equal(t, "another", list.GetWorkflows()[0].GetName())
	require.Equal(t, []string{"b", "c"}, list.GetWorkflows()[0].GetSteps())
	require.Equal(t, "@actions/step-a", list.GetWorkflows()[0].GetStartTarget())
	list, err = c.ListWorkflows(t.Context(), &flov1.ListWorkflowsRequest{Namespace: ns, Name: "defs", AllVersions: true})
	require.NoError(t, err)
	require.Len(t, list.GetWorkflows(), 2)
	require.Equal(t, "10", list.GetWorkflows()[0].GetVersion(), "newest first")

	// A pinned start runs that version; an unpinned one the latest.
	pinned, err := c.StartRun(t.Context(), &flov1.StartRunRequest{Namespace: ns, Workflow: "defs", Version: "2.0"})
	require.NoError(t, err)
	require.Equal(t, "2.0", e.run(t, ns, pinned.GetRunId()).GetVersion())
	unpinned := e.start(t, ns, "defs", "", "")
	require.Equal(t, "10", e.run(t, ns, unpinned).GetVersion())

	// Invalid YAML: every error with its code and place, nothing stored.
	_, err = c.CreateWorkflow(t.Context(), &flov1.CreateWorkflowRequest{Namespace: ns, Yaml: `kind: Workflow
name: broken
version: "1"
start:
  run: "@actions/a"
  transitions:
    success: nowhere
`})
	requireCode(t, codes.InvalidArgument, err, "E301 line 7:")
	_, err = c.GetWorkflow(t.Context(), &flov1.GetWorkflowRequest{Namespace: ns, Name: "broken"})
	requireCode(t, codes.NotFound, err, "not found")
	_, err = c.CreateWorkflow(t.Context(), &flov1.CreateWorkflowRequest{Namespace: ns, Yaml: "{{{"})
	requireCode(t, codes.InvalidArgument, err, "E100")
}

func listRuns(t *testing.T, e *env, req *flov1.ListRunsRequest) []*flov1.WorkflowRun {
	t.Helper()
	resp, err := e.client().ListRuns(t.Context(), req)
	require.NoError(t, err)
	return resp.GetRuns()
}

// testListRuns: filters by workflow, status and creation time; pages
// newest first without gaps or repeats.
func testListRuns(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.create(t, ns, fmt.Sprintf(waitYAML, "listed", "1"))
	e.create(t, ns, fmt.Sprintf(waitYAML, "other", "1"))
	var ids []string
	for range 5 {
		ids = append(ids, e.start(t, ns, "listed", `{}`, ""))
	}
	mid := time.Now()
	e.start(t, ns, "other", `{}`, "")
	_, err := e.client().CancelRun(t.Context(), &flov1.CancelRunRequest{Namespace: ns, RunId: ids[0]})
	require.NoError(t, err)

	require.Len(t, listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns}), 6)
	require.Len(t, listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, Workflow: "listed"}), 5)
	cancelled := listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, Status: stCancelled})
	require.Len(t, cancelled, 1)
	require.Equal(t, ids[0], cancelled[0].GetRunId())
	after := listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, CreatedAfter: timestamppb.New(mid)})
	require.Len(t, after, 1)
	require.Equal(t, "other", after[0].GetWorkflow())
	require.Len(t, listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, CreatedBefore: timestamppb.New(mid)}), 5)

	var paged []string
	token := ""
	for range 5 {
		resp, err := e.client().ListRuns(t.Context(), &flov1.ListRunsRequest{Namespace: ns, Workflow: "listed", Limit: 2, PageToken: token})
		require.NoError(t, err)
		for _, r := range resp.GetRuns() {
			paged = append(paged, r.GetRunId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	require.Equal(t, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}, paged)
}

// testBadInput: malformed and unknown input gets a clear error with a code.
func testBadInput(t *testing.T, e *env) {
	ns := e.namespace(t)
	c := e.client()
	ctx := t.Context()
	e.create(t, ns, fmt.Sprintf(waitYAML, "target", "1"))

	_, err := c.StartRun(ctx, &flov1.StartRunRequest{Namespace: ns, Workflow: "nope"})
	requireCode(t, codes.NotFound, err, "workflow nope not found")
	_, err = c.StartRun(ctx, &flov1.StartRunRequest{Namespace: ns, Workflow: "target", Version: "9"})
	requireCode(t, codes.NotFound, err, "workflow target version 9 not found")
	_, err = c.StartRun(ctx, &flov1.StartRunRequest{Namespace: ns, Workflow: "target", Input: []byte(`{"a":`)})
	requireCode(t, codes.InvalidArgument, err, "input is not valid JSON")
	_, err = c.StartRun(ctx, &flov1.StartRunRequest{Namespace: ns, Workflow: "target", Input: make([]byte, 70<<10)})
	requireCode(t, codes.InvalidArgument, err, "larger than the limit")
	_, err = c.StartRun(ctx, &flov1.StartRunRequest{Workflow: "target"})
	requireCode(t, codes.InvalidArgument, err, "namespace is required")
	_, err = c.CreateWorkflow(ctx, &flov1.CreateWorkflowRequest{Yaml: fmt.Sprintf(waitYAML, "x", "1")})
	requireCode(t, codes.InvalidArgument, err, "namespace is required")

	value, err := structpb.NewValue(map[string]any{"from": "rest"})
	require.NoError(t, err)
	resp, err := c.StartRun(ctx, &flov1.StartRunRequest{Namespace: ns, Workflow: "target", InputValue: value})
	require.NoError(t, err)
	id := resp.GetRunId()
	require.JSONEq(t, `{"from":"rest"}`, string(e.run(t, ns, id).GetInput()))

	_, err = c.GetRun(ctx, &flov1.GetRunRequest{Namespace: ns, RunId: "wfrun-1"})
	requireCode(t, codes.InvalidArgument, err, "is not a run id")
	unknown := uuid.NewString()
	_, err = c.GetRun(ctx, &flov1.GetRunRequest{Namespace: ns, RunId: unknown})
	requireCode(t, codes.NotFound, err, "run "+unknown+" not found")
	_, err = c.GetRun(ctx, &flov1.GetRunRequest{Namespace: "elsewhere", RunId: id})
	requireCode(t, codes.NotFound, err, "not found")
	_, err = c.GetRunHistory(ctx, &flov1.GetRunRequest{Namespace: ns, RunId: unknown})
	requireCode(t, codes.NotFound, err, "not found")
	_, err = c.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: ns, RunId: id, Type: "has space"})
	requireCode(t, codes.InvalidArgument, err, `type "has space" is invalid`)
	_, err = c.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: ns, RunId: id, Type: "go", Payload: []byte("{")})
	requireCode(t, codes.InvalidArgument, err, "payload is not valid JSON")
	_, err = c.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: ns, RunId: unknown, Type: "go"})
	requireCode(t, codes.NotFound, err, "not found")
	_, err = c.CancelRun(ctx, &flov1.CancelRunRequest{Namespace: ns, RunId: unknown})
	requireCode(t, codes.NotFound, err, "not found")
	_, err = c.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: ns, Limit: 5000})
	requireCode(t, codes.InvalidArgument, err, "limit")
	_, err = c.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: ns, PageToken: "garbage!"})
	requireCode(t, codes.InvalidArgument, err, "page_token")
	_, err = c.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: ns, Status: 42})
	requireCode(t, codes.InvalidArgument, err, "status")
	_, err = c.DisableWorkflow(ctx, &flov1.WorkflowNameRequest{Namespace: ns, Name: "nope"})
	requireCode(t, codes.NotFound, err, "workflow nope not found")

	// None of it changed the run.
	require.Equal(t, flov1.RunStatus_RUN_STATUS_WAITING, e.run(t, ns, id).GetStatus())
}

// runEvents reads the RunEvents of a run from flo.workflows.events until its
// ENDED event arrived.
func runEvents(t *testing.T, brokers []string, runID string) []*eventsv1.RunEvent {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(kafka.RunEventsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	var out []*eventsv1.RunEvent
	require.Eventually(t, func() bool {
		fetches := cl.PollFetches(t.Context())
		fetches.EachRecord(func(r *kgo.Record) {
			if string(r.Key) != runID {
				return
			}
			var ev eventsv1.RunEvent
			require.NoError(t, proto.Unmarshal(r.Value, &ev))
			out = append(out, &ev)
		})
		return len(out) > 0 && out[len(out)-1].GetType() == eventsv1.RunEventType_RUN_EVENT_TYPE_ENDED
	}, waitFor, tick)
	return out
}
