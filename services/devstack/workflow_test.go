package devstack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flo "github.com/razorbill/flo-go"
)

// runWait bounds every wait for a run: generous, because the machine is
// shared and a wait ends as soon as the run gets there.
const runWait = 60 * time.Second

// exampleYAML reads a workflow of examples/workflows, the files the
// reference's examples were copied into.
func exampleYAML(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "workflows", name+".yaml"))
	require.NoError(t, err)
	return string(b)
}

// createWorkflow creates a workflow through the gateway and checks it was
// stored without warnings.
func createWorkflow(t *testing.T, c *flo.Client, yaml string) *flo.Workflow {
	t.Helper()
	w, warnings, err := c.CreateWorkflow(context.Background(), yaml)
	require.NoError(t, err)
	require.Empty(t, warnings)
	return w
}

// waitActions waits until a worker's connect has made every action known:
// a run that invoked one before would take its target_not_found transition.
func waitActions(t *testing.T, c *flo.Client, names ...string) {
	t.Helper()
	for _, name := range names {
		require.Eventually(t, func() bool {
			_, err := c.GetAction(context.Background(), name)
			return err == nil
		}, 30*time.Second, 20*time.Millisecond, "action %s never registered", name)
	}
}

// awaitRun waits until run id ends and checks it ended with want.
func awaitRun(t *testing.T, c *flo.Client, id string, want flo.RunStatus) *flo.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runWait)
	defer cancel()
	run, err := c.AwaitRun(ctx, id)
	require.NoError(t, err)
	require.Equal(t, want, run.Status, "run %s ended %s (%s)", id, run.Status, run.Error)
	return run
}

// awaitWaiting waits until run id waits for a signal.
func awaitWaiting(t *testing.T, c *flo.Client, id string) *flo.Run {
	t.Helper()
	var run *flo.Run
	require.Eventually(t, func() bool {
		got, err := c.GetRun(context.Background(), id)
		if err != nil {
			return false
		}
		run = got
		return run.Status == flo.RunWaiting || run.Status.Final()
	}, runWait, 20*time.Millisecond, "run %s never waited", id)
	require.Equal(t, flo.RunWaiting, run.Status, "run %s ended before waiting (%s)", id, run.Error)
	return run
}

// runHistory reads a run's history as "type step" lines and checks the events
// are numbered from 1 without gaps and stamped in order.
func runHistory(t *testing.T, c *flo.Client, id string) []string {
	t.Helper()
	evs, err := c.GetRunHistory(context.Background(), id)
	require.NoError(t, err)
	out := make([]string, len(evs))
	for i, ev := range evs {
		require.Equal(t, int64(i+1), ev.Seq, "history of run %s", id)
		require.False(t, ev.At.IsZero(), "history event %d of run %s has no time", ev.Seq, id)
		if i > 0 {
			require.False(t, ev.At.Before(evs[i-1].At), "history of run %s goes back in time at %d", id, ev.Seq)
		}
		out[i] = ev.Type + " " + ev.Step
	}
	return out
}

// actionSteps are the history lines of one run step whose attempts all
// end with a result: started, each attempt awaited and answered, retries
// between attempts, completed.
func actionSteps(step string, attempts int) []string {
	out := []string{"step_started " + step}
	for i := range attempts {
		if i > 0 {
			out = append(out, "step_retry "+step)
		}
		out = append(out, "awaiting_action "+step, "action_completed "+step)
	}
	return append(out, "step_completed "+step)
}

// orderInput is the input of the reference's order workflows.
type orderInput struct {
	OrderID string  `json:"order_id"`
	Amount  float64 `json:"amount"`
}

// shop implements the actions of the reference's two examples as a user's
// worker would, and records what it was asked to do.
type shop struct {
	mu      sync.Mutex
	charges map[string]int    // order id -> charge attempts
	shipped map[string]string // order id -> ship-order input
	// early holds validate-order for ORD-EARLY until closed; entered is
	// closed when that validation began.
	early, entered chan struct{}
	enterOnce      sync.Once
}

func newShop() *shop {
	return &shop{
		charges: map[string]int{}, shipped: map[string]string{},
		early: make(chan struct{}), entered: make(chan struct{}),
	}
}

// register registers the handlers of both examples' actions.
func (s *shop) register(w *flo.ActionWorker) {
	w.MustRegisterAction("validate-order", func(actx *flo.ActionContext) ([]byte, error) {
		var o orderInput
		if err := actx.Into(&o); err != nil {
			return nil, flo.NewNonRetryableErrorf("decode order: %w", err)
		}
		if o.OrderID == "ORD-EARLY" {
			s.enterOnce.Do(func() { close(s.entered) })
			<-s.early
		}
		return actx.Bytes(map[string]any{"valid": true, "order_id": o.OrderID})
	})
	w.MustRegisterAction("charge-payment", func(actx *flo.ActionContext) ([]byte, error) {
		var o orderInput
		if err := actx.Into(&o); err != nil {
			return nil, flo.NewNonRetryableErrorf("decode order: %w", err)
		}
		s.mu.Lock()
		s.charges[o.OrderID]++
		n := s.charges[o.OrderID]
		s.mu.Unlock()
		// ORD-123's card network times out once: the step's retry block
		// takes the second attempt.
		if o.OrderID == "ORD-123" && n == 1 {
			return nil, errors.New("card network timeout")
		}
		return actx.Bytes(map[string]string{"payment_id": "pay-" + o.OrderID})
	})
	w.MustRegisterAction("create-shipment", func(actx *flo.ActionContext) ([]byte, error) {
		var o orderInput
		if err := actx.Into(&o); err != nil {
			return nil, flo.NewNonRetryableErrorf("decode order: %w", err)
		}
		return actx.Bytes(map[string]string{"tracking": "TRK-" + o.OrderID})
	})
	w.MustRegisterAction("check-approval-needed", func(actx *flo.ActionContext) ([]byte, error) {
		var o orderInput
		if err := actx.Into(&o); err != nil {
			return nil, flo.NewNonRetryableErrorf("decode order: %w", err)
		}
		// The example's failure transition means "needs approval".
		if o.Amount > 1000 {
			return nil, flo.NewNonRetryableErrorf("order %s of %.2f needs a manager's approval", o.OrderID, o.Amount)
		}
		return actx.Bytes(map[string]string{"approval": "automatic"})
	})
	w.MustRegisterAction("ship-order", func(actx *flo.ActionContext) ([]byte, error) {
		var o orderInput
		if err := actx.Into(&o); err != nil {
			return nil, flo.NewNonRetryableErrorf("decode order: %w", err)
		}
		s.mu.Lock()
		s.shipped[o.OrderID] = string(actx.Payload())
		s.mu.Unlock()
		return actx.Bytes(map[string]bool{"shipped": true})
	})
}

func (s *shop) chargesOf(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.charges[id]
}

func (s *shop) wasShipped(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.shipped[id]
	return ok
}

// The order-processing versions the tests create: the example as it is, and
// a copy whose approval times out quickly.
const (
	orderVersion      = "1.0.0"
	shortOrderVersion = "1.0.0-short-timeout"
)

// TestReferenceWorkflowsEndToEnd runs the reference's two examples, created
// from examples/workflows through the gateway, on the whole platform with a
// real SDK worker implementing their actions.
func TestReferenceWorkflowsEndToEnd(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, "default")
	s := newShop()
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 16}, s.register)
	waitActions(t, c, "validate-order", "charge-payment", "create-shipment", "check-approval-needed", "ship-order")

	w := createWorkflow(t, c, exampleYAML(t, "process-order"))
	require.Equal(t, "process-order", w.Name)
	require.Equal(t, "1.0.0", w.Version)
	orders := exampleYAML(t, "order-processing")
	createWorkflow(t, c, orders)
	short := strings.Replace(orders, "timeoutMs: 3600000", "timeoutMs: 300", 1)
	short = strings.Replace(short, `version: "1.0.0"`, `version: "`+shortOrderVersion+`"`, 1)
	require.NotEqual(t, orders, short)
	createWorkflow(t, c, short)

	t.Run("process-order completes", func(t *testing.T) { t.Parallel(); testProcessOrderE2E(t, e, c, s) })
	t.Run("approval signal while waiting", func(t *testing.T) { t.Parallel(); testApprovalE2E(t, c, s) })
	t.Run("approval times out", func(t *testing.T) { t.Parallel(); testApprovalTimeoutE2E(t, c, s) })
	t.Run("signal before the step waits", func(t *testing.T) { t.Parallel(); testEarlySignalE2E(t, c, s) })
	t.Run("child workflow", func(t *testing.T) { t.Parallel(); testChildE2E(t, c) })
	t.Run("cancel a waiting run", func(t *testing.T) { t.Parallel(); testCancelWaitingE2E(t, c) })
}

// startOrder starts a run with an idempotency key, as both examples require.
func startOrder(t *testing.T, c *flo.Client, workflow, version string, o orderInput) string {
	t.Helper()
	started, err := c.StartWorkflow(context.Background(), workflow, o, flo.StartWorkflowOptions{
		Version: version, IdempotencyKey: "key-" + o.OrderID,
	})
	require.NoError(t, err)
	require.True(t, started.Created)
	return started.RunID
}

// runJSON is a run's status as `flo workflow status` prints it.
type runJSON struct {
	RunID          string          `json:"run_id"`
	Workflow       string          `json:"workflow"`
	Version        string          `json:"version"`
	Status         string          `json:"status"`
	CurrentStep    *string         `json:"current_step"`
	Terminal       string          `json:"terminal"`
	Input          json.RawMessage `json:"input"`
	IdempotencyKey string          `json:"idempotency_key"`
	Outputs        []struct {
		Step       string          `json:"step"`
		Outcome    string          `json:"outcome"`
		Output     json.RawMessage `json:"output"`
		Attempts   int             `json:"attempts"`
		FinishedAt time.Time       `json:"finished_at"`
	} `json:"outputs"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	FinishedAt time.Time `json:"finished_at"`
}

func statusJSON(t *testing.T, run *flo.Run) runJSON {
	t.Helper()
	b, err := json.Marshal(run)
	require.NoError(t, err)
	var out runJSON
	require.NoError(t, json.Unmarshal(b, &out), "%s", b)
	return out
}

func testProcessOrderE2E(t *testing.T, e *env, c *flo.Client, s *shop) {
	ctx := context.Background()
	_, err := c.StartWorkflow(ctx, "process-order", orderInput{OrderID: "ORD-NOKEY"}, flo.StartWorkflowOptions{})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "idempotency: required refuses a start without a key: %v", err)

	id := startOrder(t, c, "process-order", "", orderInput{OrderID: "ORD-123", Amount: 99.99})
	again, err := c.StartWorkflow(ctx, "process-order", orderInput{OrderID: "ORD-123", Amount: 99.99},
		flo.StartWorkflowOptions{IdempotencyKey: "key-ORD-123"})
	require.NoError(t, err)
	require.Equal(t, id, again.RunID, "same key, same run")
	require.False(t, again.Created)

	st := statusJSON(t, awaitRun(t, c, id, flo.RunCompleted))
	require.Equal(t, id, st.RunID)
	require.Equal(t, "process-order", st.Workflow)
	require.Equal(t, "1.0.0", st.Version)
	require.Equal(t, "completed", st.Status)
	require.Equal(t, "flo.Completed", st.Terminal)
	require.Nil(t, st.CurrentStep, "an ended run is at no step")
	require.Equal(t, "key-ORD-123", st.IdempotencyKey)
	require.JSONEq(t, `{"order_id":"ORD-123","amount":99.99}`, string(st.Input))
	require.Len(t, st.Outputs, 3)
	for i, want := range []struct {
		step, output string
		attempts     int
	}{
		{"_start", `{"valid":true,"order_id":"ORD-123"}`, 1},
		{"charge", `{"payment_id":"pay-ORD-123"}`, 2},
		{"ship", `{"tracking":"TRK-ORD-123"}`, 1},
	} {
		out := st.Outputs[i]
		require.Equal(t, want.step, out.Step, "outputs in the order the steps finished")
		require.Equal(t, "success", out.Outcome)
		require.JSONEq(t, want.output, string(out.Output))
		require.Equal(t, want.attempts, out.Attempts, "attempts of %s", want.step)
		require.False(t, out.FinishedAt.Before(st.CreatedAt))
		require.False(t, out.FinishedAt.After(st.FinishedAt))
		if i > 0 {
			require.False(t, out.FinishedAt.Before(st.Outputs[i-1].FinishedAt))
		}
	}
	require.False(t, st.CreatedAt.IsZero())
	require.False(t, st.FinishedAt.Before(st.CreatedAt))
	require.False(t, st.UpdatedAt.Before(st.CreatedAt))
	require.Equal(t, 2, s.chargesOf("ORD-123"), "the charge ran once per attempt")

	require.Equal(t, slices.Concat(
		[]string{"workflow_started "},
		actionSteps("_start", 1), actionSteps("charge", 2), actionSteps("ship", 1),
		[]string{"workflow_completed ship"},
	), runHistory(t, c, id))

	// The REST facade shows the same run.
	resp, err := restCall(http.MethodGet, fmt.Sprintf("http://%s/v1/namespaces/default/runs/%s", e.stack.GatewayHTTPAddr(), id), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var rest struct {
		RunID    string `json:"runId"`
		Status   string `json:"status"`
		Terminal string `json:"terminal"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rest))
	require.Equal(t, id, rest.RunID)
	require.Equal(t, "RUN_STATUS_COMPLETED", rest.Status)
	require.Equal(t, "flo.Completed", rest.Terminal)
}

// orderHead is the history of an order-processing run up to its approval
// check, which failed when approval is needed.
func orderHead() []string {
	return slices.Concat(
		[]string{"workflow_started "},
		actionSteps("_start", 1), actionSteps("process_payment", 1), actionSteps("check_approval", 1),
	)
}

func testApprovalE2E(t *testing.T, c *flo.Client, s *shop) {
	big := startOrder(t, c, "order-processing", orderVersion, orderInput{OrderID: "ORD-BIG", Amount: 5000})
	small := startOrder(t, c, "order-processing", orderVersion, orderInput{OrderID: "ORD-SMALL", Amount: 10})

	run := awaitWaiting(t, c, big)
	require.Equal(t, "await_approval", run.CurrentStep)
	require.Equal(t, "approval", run.WaitingFor)
	require.True(t, run.FinishedAt.IsZero())
	require.Equal(t, "failure", run.Output("check_approval").Outcome, "the approval check's failure led here")
	require.False(t, s.wasShipped("ORD-BIG"), "nothing ships before the approval")

	_, err := c.SignalRun(context.Background(), big, "approval", map[string]string{"decision": "approved", "approver": "manager@co.com"})
	require.NoError(t, err)
	run = awaitRun(t, c, big, flo.RunCompleted)
	require.Equal(t, "OrderCompleted", run.Terminal)
	require.JSONEq(t, `{"decision":"approved","approver":"manager@co.com"}`, string(run.Output("await_approval").Output),
		"the signal's payload is the waiting step's output")
	require.True(t, s.wasShipped("ORD-BIG"))
	require.Equal(t, slices.Concat(orderHead(), []string{
		"step_started await_approval", "waiting_for_signal await_approval",
		"signal_received await_approval", "signal_matched await_approval", "step_completed await_approval",
	}, actionSteps("fulfill", 1), []string{"workflow_completed fulfill"}), runHistory(t, c, big))

	run = awaitRun(t, c, small, flo.RunCompleted)
	require.Equal(t, "OrderCompleted", run.Terminal)
	require.Nil(t, run.Output("await_approval"))
	require.Equal(t, slices.Concat(
		[]string{"workflow_started "},
		actionSteps("_start", 1), actionSteps("process_payment", 1), actionSteps("check_approval", 1),
		actionSteps("fulfill", 1), []string{"workflow_completed fulfill"},
	), runHistory(t, c, small), "a small order needs no approval")
}

func testApprovalTimeoutE2E(t *testing.T, c *flo.Client, s *shop) {
	id := startOrder(t, c, "order-processing", shortOrderVersion, orderInput{OrderID: "ORD-LATE", Amount: 5000})
	run := awaitRun(t, c, id, flo.RunFailed)
	require.Equal(t, "OrderRejected", run.Terminal)
	require.Equal(t, shortOrderVersion, run.Version)
	require.False(t, s.wasShipped("ORD-LATE"))
	require.Equal(t, slices.Concat(orderHead(), []string{
		"step_started await_approval", "waiting_for_signal await_approval",
		"signal_timeout await_approval", "step_completed await_approval", "workflow_failed await_approval",
	}), runHistory(t, c, id))
	evs, err := c.GetRunHistory(context.Background(), id)
	require.NoError(t, err)
	timeout := evs[len(evs)-3]
	require.Equal(t, "signal_timeout", timeout.Type)
	require.Equal(t, "OrderRejected", timeout.Detail, "the timeout names where it led")

	_, err = c.SignalRun(context.Background(), id, "approval", map[string]string{"decision": "too late"})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "an ended run takes no signals: %v", err)
}

func testEarlySignalE2E(t *testing.T, c *flo.Client, s *shop) {
	id := startOrder(t, c, "order-processing", orderVersion, orderInput{OrderID: "ORD-EARLY", Amount: 5000})
	select {
	case <-s.entered:
	case <-time.After(runWait):
		t.Fatal("ORD-EARLY was never validated")
	}
	// The run is still validating: the approval is kept for later.
	_, err := c.SignalRun(context.Background(), id, "approval", map[string]string{"decision": "approved early"})
	require.NoError(t, err)
	run, err := c.GetRun(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, "_start", run.CurrentStep)
	close(s.early)

	run = awaitRun(t, c, id, flo.RunCompleted)
	require.Equal(t, "OrderCompleted", run.Terminal)
	require.JSONEq(t, `{"decision":"approved early"}`, string(run.Output("await_approval").Output))
	require.Equal(t, slices.Concat(
		[]string{"workflow_started ", "step_started _start", "awaiting_action _start", "signal_received _start",
			"action_completed _start", "step_completed _start"},
		actionSteps("process_payment", 1), actionSteps("check_approval", 1),
		[]string{"step_started await_approval", "signal_matched await_approval", "step_completed await_approval"},
		actionSteps("fulfill", 1), []string{"workflow_completed fulfill"},
	), runHistory(t, c, id), "the kept signal is matched without waiting")
}

// orderBatchYAML runs process-order, pinned to its version, as a child.
const orderBatchYAML = `kind: Workflow
name: order-batch
version: "1"
start:
  run: "@workflow/process-order:1.0.0"
  inputMapping: '{"order_id": "$.input.order_id", "amount": "$.input.amount"}'
  transitions:
    success: flo.Completed
    failure: flo.Failed
`

func testChildE2E(t *testing.T, c *flo.Client) {
	createWorkflow(t, c, orderBatchYAML)
	started, err := c.StartWorkflow(context.Background(), "order-batch", orderInput{OrderID: "ORD-CHILD", Amount: 20}, flo.StartWorkflowOptions{})
	require.NoError(t, err)
	parent := awaitRun(t, c, started.RunID, flo.RunCompleted)
	require.Equal(t, "flo.Completed", parent.Terminal)
	require.JSONEq(t, `{"tracking":"TRK-ORD-CHILD"}`, string(parent.Output("_start").Output), "the child's output is the step's")

	children, _, err := c.ListRuns(context.Background(), flo.RunFilter{Workflow: "process-order", Limit: 1000})
	require.NoError(t, err)
	var child *flo.Run
	for _, r := range children {
		if r.ParentRunID == parent.ID {
			require.Nil(t, child, "the parent started one child")
			child = r
		}
	}
	require.NotNil(t, child, "no child run of %s", parent.ID)
	require.Equal(t, flo.RunCompleted, child.Status)
	require.Equal(t, "1.0.0", child.Version)
	require.Equal(t, []string{
		"workflow_started ", "step_started _start", "child_started _start", "child_completed _start",
		"step_completed _start", "workflow_completed _start",
	}, runHistory(t, c, parent.ID))
}

func testCancelWaitingE2E(t *testing.T, c *flo.Client) {
	id := startOrder(t, c, "order-processing", orderVersion, orderInput{OrderID: "ORD-CANCEL", Amount: 9000})
	awaitWaiting(t, c, id)
	run, err := c.CancelRun(context.Background(), id, "customer changed their mind")
	require.NoError(t, err)
	require.Equal(t, flo.RunCancelled, run.Status)
	run = awaitRun(t, c, id, flo.RunCancelled)
	require.Equal(t, "flo.Cancelled", run.Terminal)
	require.Equal(t, slices.Concat(orderHead(), []string{
		"step_started await_approval", "waiting_for_signal await_approval", "workflow_cancelled await_approval",
	}), runHistory(t, c, id))
	_, err = c.SignalRun(context.Background(), id, "approval", map[string]string{"decision": "approved"})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "a cancelled run takes no signals: %v", err)
}

// threeStepYAML is the workflow the kill tests run: step b's first attempt
// of every run fails, so retry timers are set when the fault strikes.
const threeStepYAML = `kind: Workflow
name: three-step
version: "1"
idempotency: optional
start:
  run: "@actions/step-a"
  transitions:
    success: b
    failure: flo.Failed
steps:
  b:
    run: "@actions/step-b"
    retry:
      max_attempts: 5
      backoff: constant
      initial_delay_ms: 100
    transitions:
      success: c
      failure: flo.Failed
  c:
    run: "@actions/step-c"
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// runsThroughFault starts runs concurrent three-step runs with SDK workers
// handling the steps and calls fault once the handlers have been called as
// many times as there are runs, when at most a quarter of the runs can have
// finished. Every run must then complete, and its history must show each
// step's transitions once: a step_started and a step_completed per step and
// one awaited action per attempt, however often the handlers ran.
func runsThroughFault(t *testing.T, gateway string, runs int, fault func()) {
	t.Helper()
	c := connect(t, gateway)
	ctx := context.Background()
	// Short leases, so a task whose worker lost its answer in the fault
	// comes back quickly; many attempts, so no fault fails a step.
	for _, action := range []string{"step-a", "step-b", "step-c"} {
		_, err := c.RegisterAction(ctx, action, flo.ActionOptions{Timeout: 3 * time.Second, MaxAttempts: 20})
		require.NoError(t, err)
	}
	createWorkflow(t, c, threeStepYAML)

	var (
		handled   atomic.Int64
		completed atomic.Int64 // step-c handler calls
		trigger   = make(chan struct{})
		once      sync.Once
		mu        sync.Mutex
		failedB   = map[int]bool{}
	)
	count := func() {
		if handled.Add(1) >= int64(runs) {
			once.Do(func() { close(trigger) })
		}
	}
	type input struct{ N int }
	actionWorker(t, gateway, flo.ActionWorkerOptions{Concurrency: 32}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("step-a", func(actx *flo.ActionContext) ([]byte, error) {
			count()
			return actx.Bytes(map[string]string{"a": "done"})
		})
		w.MustRegisterAction("step-b", func(actx *flo.ActionContext) ([]byte, error) {
			count()
			var in input
			if err := actx.Into(&in); err != nil {
				return nil, flo.NewNonRetryableErrorf("decode input: %w", err)
			}
			mu.Lock()
			first := !failedB[in.N]
			failedB[in.N] = true
			mu.Unlock()
			if first {
				return nil, errors.New("transient failure")
			}
			return actx.Bytes(map[string]string{"b": "done"})
		})
		w.MustRegisterAction("step-c", func(actx *flo.ActionContext) ([]byte, error) {
			count()
			completed.Add(1)
			return actx.Bytes(map[string]string{"c": "done"})
		})
	})

	// Starts may still be going on when the fault strikes: each is retried
	// with its idempotency key until accepted, as a careful client does.
	ids := make([]string, runs)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= runs {
					return
				}
				deadline := time.Now().Add(runWait)
				for {
					started, err := c.StartWorkflow(ctx, "three-step", input{N: i}, flo.StartWorkflowOptions{IdempotencyKey: fmt.Sprintf("run-%d", i)})
					if err == nil {
						ids[i] = started.RunID
						break
					}
					if !retryable(err) || time.Now().After(deadline) {
						t.Errorf("start %d never accepted: %v", i, err)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}

	select {
	case <-trigger:
	case <-time.After(runWait):
		wg.Wait()
		t.Fatalf("runs never got going: %d handler calls", handled.Load())
	}
	require.Less(t, completed.Load(), int64(runs), "every run finished before the fault")
	t.Logf("fault after %d handler calls, %d runs at their last step", handled.Load(), completed.Load())
	fault()
	t.Logf("fault over after %d handler calls, %d runs at their last step", handled.Load(), completed.Load())
	wg.Wait()
	require.False(t, t.Failed())

	seen := map[string]bool{}
	for i, id := range ids {
		require.NotEmpty(t, id, "start %d", i)
		require.False(t, seen[id], "starts %d and another got run %s", i, id)
		seen[id] = true
	}
	require.Eventually(t, func() bool {
		done, _, err := c.ListRuns(ctx, flo.RunFilter{Workflow: "three-step", Status: flo.RunCompleted, Limit: 1000})
		return err == nil && len(done) == runs
	}, 90*time.Second, 100*time.Millisecond, "not every run completed")
	all, _, err := c.ListRuns(ctx, flo.RunFilter{Workflow: "three-step", Limit: 1000})
	require.NoError(t, err)
	require.Len(t, all, runs, "a start was repeated")

	extra := 0
	for _, id := range ids {
		run, err := c.GetRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "flo.Completed", run.Terminal)
		b := run.Output("b")
		require.NotNil(t, b)
		require.GreaterOrEqual(t, b.Attempts, 2, "run %s: step b's first attempt fails", id)
		extra += b.Attempts - 2
		require.Equal(t, slices.Concat(
			[]string{"workflow_started "},
			actionSteps("_start", 1), actionSteps("b", b.Attempts), actionSteps("c", 1),
			[]string{"workflow_completed c"},
		), runHistory(t, c, id), "history of run %s", id)
	}
	t.Logf("%d handler calls for %d runs, %d extra attempts of step b", handled.Load(), runs, extra)
}

// retryable reports whether a call failed for a passing reason: a service
// restarting behind the gateway.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

// TestRestartMidRunsRepeatsNoTransition restarts each part a run's
// progress goes through while hundreds of runs are under way.
func TestRestartMidRunsRepeatsNoTransition(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restart func(e *env) error
	}{
		{name: "workflow service", restart: func(e *env) error {
			return errors.Join(e.stack.StopWorkflow(), e.stack.StartWorkflow(context.Background()))
		}},
		{name: "dispatcher", restart: func(e *env) error {
			return errors.Join(e.stack.StopDispatcher(), e.stack.StartDispatcher(context.Background()))
		}},
		{name: "broker", restart: func(e *env) error { return e.broker.Restart() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			runsThroughFault(t, e.stack.GatewayGRPCAddr(), 300, func() { require.NoError(t, tc.restart(e)) })
		})
	}
}
