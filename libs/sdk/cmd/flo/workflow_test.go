package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flo "github.com/razorbill/flo-go"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/services/devstack"
)

// The workflow tests run the CLI and the SDK against the whole platform: real Postgres, a
// Kafka-protocol broker and every service, with an SDK ActionWorker running the actions.

// testAdminToken is the admin key of the stacks these tests start. TestMain
// hands it to the command line and the SDK as FLO_TOKEN, as a user's shell would.
const testAdminToken = "flo_admin_cli-test-token"

func TestMain(m *testing.M) {
	if err := os.Setenv("FLO_TOKEN", testAdminToken); err != nil {
		panic(err)
	}
	os.Exit(harness.Main(m))
}

// orderYAML validates an order, then charges it with a mapped input.
const orderYAML = `kind: Workflow
name: order
version: "1"
idempotency: optional
start:
  run: "@actions/validate-order"
  transitions:
    success: charge
    failure: flo.Failed
steps:
  charge:
    run: "@actions/charge-payment"
    inputMapping: '{"order": "$.input.order_id", "valid": "$.steps._start.output.valid"}'
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// approvalYAML waits for an approval signal after validating, then charges; without the
// signal within an hour the order is rejected.
const approvalYAML = `kind: Workflow
name: approval
version: "1"
idempotency: optional
terminals:
  OrderRejected:
    status: failed
start:
  run: "@actions/validate-order"
  transitions:
    success: await_approval
    failure: flo.Failed
steps:
  await_approval:
    waitForSignal:
      type: approval
      timeoutMs: 3600000
      onTimeout: OrderRejected
    transitions:
      success: charge
  charge:
    run: "@actions/charge-payment"
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// holdYAML waits for a release signal with no timeout, which the validator warns about.
const holdYAML = `kind: Workflow
name: hold
version: "1"
start:
  waitForSignal:
    type: release
  transitions:
    success: flo.Completed
`

// brokenYAML sends a transition nowhere: line 8, column 14 is the bad target.
const brokenYAML = `kind: Workflow
name: broken
version: "1"
start:
  run: "@actions/validate-order"
  transitions:
    success: charge
    failure: nowhere
steps:
  charge:
    run: "@actions/charge-payment"
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// workflowStack is one test's platform with the order actions served by an ActionWorker.
type workflowStack struct {
	addr   string
	client *flo.Client
}

func startWorkflowStack(t *testing.T) *workflowStack {
	t.Helper()
	stack, log := startDevStack(t, nil)
	s := &workflowStack{addr: stack.GatewayGRPCAddr(), client: flo.NewClient(stack.GatewayGRPCAddr(), flo.WithNamespace("myapp"))}
	require.NoError(t, s.client.Connect())
	t.Cleanup(func() { _ = s.client.Close() })
	s.serveActions(t, log)
	return s
}

// startDevStack starts the whole platform on loopback over a fresh database and broker, with
// the test admin key; adjust, when not nil, changes the configuration first.
func startDevStack(t *testing.T, adjust func(*devstack.Config)) (*devstack.Stack, *slog.Logger) {
	t.Helper()
	broker := harness.NewBroker(t)
	cfg := devstack.Config{
		DatabaseURL:         harness.NewDatabase(t),
		Kafka:               config.Kafka{Brokers: broker.Addrs(), Partitions: 4},
		Namespaces:          []string{"default", "myapp"},
		HeartbeatTimeout:    90 * time.Second,
		HealthCheckInterval: time.Second,
		MaxPayloadBytes:     64 << 10,
		AdminToken:          testAdminToken,
	}
	cfg.OnEphemeralPorts()
	if adjust != nil {
		adjust(&cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stack, err := devstack.Start(ctx, cfg, log)
	require.NoError(t, err)
	t.Cleanup(stack.Stop)
	return stack, log
}

// serveActions registers the actions the test workflows run and starts a worker for them:
// validate-order echoes the order id as valid, charge-payment returns what it was given.
func (s *workflowStack) serveActions(t *testing.T, log *slog.Logger) {
	t.Helper()
	ctx := context.Background()
	for _, name := range []string{"validate-order", "charge-payment"} {
		_, err := s.client.RegisterAction(ctx, name, flo.ActionOptions{MaxAttempts: 1})
		require.NoError(t, err)
	}
	w, err := s.client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 4, Logger: log})
	require.NoError(t, err)
	w.MustRegisterAction("validate-order", func(actx *flo.ActionContext) (any, error) {
		var order struct {
			OrderID string `json:"order_id"`
		}
		if err := actx.Into(&order); err != nil {
			return nil, flo.NewNonRetryableError(err)
		}
		return map[string]any{"valid": true, "order_id": order.OrderID}, nil
	})
	w.MustRegisterAction("charge-payment", func(actx *flo.ActionContext) (any, error) {
		var in map[string]any
		if err := actx.Into(&in); err != nil {
			return nil, flo.NewNonRetryableError(err)
		}
		return map[string]any{"charged": in}, nil
	})
	startWorker(t, w)
}

// startWorker runs w until the test ends.
func startWorker(t *testing.T, w *flo.ActionWorker) {
	t.Helper()
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(wctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("worker did not stop")
		}
	})
}

// cli runs the command line against the stack in namespace myapp.
func (s *workflowStack) cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLI(t, append([]string{"--addr", s.addr, "-n", "myapp"}, args...)...)
}

// ok runs the command line, requires it to succeed and returns its standard output.
func (s *workflowStack) ok(t *testing.T, args ...string) string {
	t.Helper()
	code, stdout, stderr := s.cli(t, args...)
	require.Equal(t, 0, code, "flo %s: %s", strings.Join(args, " "), stderr)
	return stdout
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	return v
}

// cliRun is the part of `workflow status` output the tests read.
type cliRun struct {
	RunID      string `json:"run_id"`
	Workflow   string `json:"workflow"`
	Version    string `json:"version"`
	Status     string `json:"status"`
	Terminal   string `json:"terminal"`
	WaitingFor string `json:"waiting_for"`
	Outputs    []struct {
		Step    string          `json:"step"`
		Outcome string          `json:"outcome"`
		Output  json.RawMessage `json:"output"`
	} `json:"outputs"`
}

func TestWorkflowCommandsEndToEnd(t *testing.T) {
	s := startWorkflowStack(t)

	// An invalid definition: each diagnostic on stderr, exit 1, nothing stored.
	broken := writeFile(t, "broken.yaml", brokenYAML)
	for _, verb := range []string{"validate", "create"} {
		code, stdout, stderr := s.cli(t, "workflow", verb, "-f", broken)
		require.Equal(t, 1, code, verb)
		require.Empty(t, stdout, verb)
		require.Regexp(t, `(?m)^8:14 E301 (start\.)?transitions\.failure: .*nowhere`, stderr, verb)
		require.Contains(t, stderr, "flo: "+broken+": invalid workflow definition (1 error)", verb)
	}
	require.JSONEq(t, `[]`, s.ok(t, "workflow", "list"), "an invalid definition creates nothing")

	// validate is a dry run; create stores and prints the version and warnings.
	order := writeFile(t, "order.yaml", orderYAML)
	got := decode[map[string]any](t, s.ok(t, "workflow", "validate", "-f", order))
	require.Equal(t, "order", got["name"])
	require.JSONEq(t, `[]`, s.ok(t, "workflow", "list"), "validate stores nothing")
	got = decode[map[string]any](t, s.ok(t, "workflow", "create", "-f", order))
	require.Equal(t, "order", got["name"])
	require.Equal(t, "1", got["version"])
	require.Equal(t, []any{}, got["warnings"])
	require.NotContains(t, got, "yaml")

	code, stdout, stderr := runCLIWithInput(t, holdYAML, "--addr", s.addr, "-n", "myapp", "workflow", "create", "-f", "-")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^\d+:\d+ W501 start`, stderr, "a warning is shown")
	hold := decode[struct {
		Name     string
		Warnings []flo.Diagnostic
	}](t, stdout)
	require.Equal(t, "hold", hold.Name)
	require.Len(t, hold.Warnings, 1)
	require.Equal(t, "W501", hold.Warnings[0].Code)
	require.Equal(t, flo.SeverityWarning, hold.Warnings[0].Severity)
	s.ok(t, "workflow", "create", "-f", writeFile(t, "approval.yaml", approvalYAML))

	def := decode[flo.Workflow](t, s.ok(t, "workflow", "get", "order", "--version", "1"))
	require.Equal(t, orderYAML, def.YAML)
	require.Equal(t, "@actions/validate-order", def.StartTarget)
	names := map[string]bool{}
	for _, w := range decode[[]flo.Workflow](t, s.ok(t, "workflow", "list")) {
		names[w.Name] = true
		require.Empty(t, w.YAML, "list leaves the YAML out")
	}
	require.Equal(t, map[string]bool{"order": true, "hold": true, "approval": true}, names)

	// start --wait runs the workflow through the worker's actions.
	run := decode[cliRun](t, s.ok(t, "workflow", "start", "order", `{"order_id":"o-1"}`, "--wait", "--timeout", "1m"))
	require.Equal(t, "completed", run.Status)
	require.Equal(t, "flo.Completed", run.Terminal)
	require.Len(t, run.Outputs, 2)
	require.Equal(t, "charge", run.Outputs[1].Step)
	require.JSONEq(t, `{"charged":{"order":"o-1","valid":true}}`, string(run.Outputs[1].Output))
	status := decode[cliRun](t, s.ok(t, "workflow", "status", run.RunID))
	require.Equal(t, run.RunID, status.RunID)
	require.Equal(t, "completed", status.Status)

	// The same idempotency key returns the same run; input from a file.
	input := writeFile(t, "input.json", `{"order_id":"o-2"}`)
	first := decode[flo.StartedRun](t, s.ok(t, "workflow", "start", "order", "-i", "@"+input, "--idempotency-key", "order-2"))
	require.True(t, first.Created)
	again := decode[flo.StartedRun](t, s.ok(t, "workflow", "start", "order", `{"order_id":"o-2"}`, "--idempotency-key", "order-2"))
	require.Equal(t, flo.StartedRun{RunID: first.RunID, Created: false}, again)

	// A run waiting for a signal resumes when it arrives.
	waiting := decode[flo.StartedRun](t, s.ok(t, "workflow", "start", "approval", "--input", `{"order_id":"o-3"}`))
	require.Eventually(t, func() bool {
		st := decode[cliRun](t, s.ok(t, "workflow", "status", waiting.RunID))
		return st.Status == "waiting" && st.WaitingFor == "approval"
	}, 30*time.Second, 50*time.Millisecond)
	sig := decode[map[string]string](t, s.ok(t, "workflow", "signal", waiting.RunID, "--type", "approval", "--data", `{"decision":"approved"}`))
	require.NotEmpty(t, sig["signal_id"])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	approved, err := s.client.AwaitRun(ctx, waiting.RunID)
	require.NoError(t, err)
	require.Equal(t, flo.RunCompleted, approved.Status)

	history := s.ok(t, "workflow", "history", waiting.RunID)
	lines := strings.Split(strings.TrimSpace(history), "\n")
	require.Regexp(t, `^\s*1  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z  workflow_started\s+\{"order_id":"o-3"\}$`, lines[0])
	require.Regexp(t, `(?m)^\s*\d+  \S+  signal_received\s+.*approval`, history)
	require.Regexp(t, `workflow_completed\s+.*flo\.Completed$`, lines[len(lines)-1])
	events := decode[[]flo.HistoryEvent](t, s.ok(t, "workflow", "history", waiting.RunID, "--json"))
	require.Len(t, events, len(lines), "one line per event")
	for i, e := range events {
		require.Equal(t, int64(i+1), e.Seq)
	}

	// Cancel a waiting run; the reason lands in its history.
	held := decode[flo.StartedRun](t, s.ok(t, "workflow", "start", "hold"))
	require.Eventually(t, func() bool {
		return decode[cliRun](t, s.ok(t, "workflow", "status", held.RunID)).Status == "waiting"
	}, 30*time.Second, 50*time.Millisecond)
	cancelled := decode[cliRun](t, s.ok(t, "workflow", "cancel", held.RunID, "--reason", "no longer needed"))
	require.Equal(t, "cancelled", cancelled.Status)
	require.Regexp(t, `workflow_cancelled\s+.*no longer needed`, s.ok(t, "workflow", "history", held.RunID))

	// runs lists with filters.
	list := decode[struct {
		Runs []cliRun `json:"runs"`
	}](t, s.ok(t, "workflow", "runs", "--workflow", "order", "--status", "completed", "--since", "1h"))
	require.NotEmpty(t, list.Runs)
	for _, r := range list.Runs {
		require.Equal(t, "order", r.Workflow)
		require.Equal(t, "completed", r.Status)
	}
	list = decode[struct {
		Runs []cliRun `json:"runs"`
	}](t, s.ok(t, "workflow", "runs", "--status", "cancelled"))
	require.Len(t, list.Runs, 1)
	require.Equal(t, held.RunID, list.Runs[0].RunID)

	// A disabled workflow refuses starts until it is enabled again.
	disabled := decode[flo.Workflow](t, s.ok(t, "workflow", "disable", "order"))
	require.False(t, disabled.Enabled)
	code, stdout, stderr = s.cli(t, "workflow", "start", "order", `{"order_id":"o-4"}`)
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "flo: start workflow order:")
	require.Contains(t, stderr, "FailedPrecondition")
	require.Contains(t, stderr, "disabled")
	require.True(t, decode[flo.Workflow](t, s.ok(t, "workflow", "enable", "order")).Enabled)
	decode[flo.StartedRun](t, s.ok(t, "workflow", "start", "order", `{"order_id":"o-4"}`))

	code, stdout, stderr = s.cli(t, "workflow", "status", "00000000-0000-0000-0000-000000000000")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "NotFound")
}

func TestWorkflowClientEndToEnd(t *testing.T) {
	s := startWorkflowStack(t)
	c := s.client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A definition with errors: every diagnostic with its place, nothing stored.
	_, _, err := c.CreateWorkflow(ctx, brokenYAML)
	var invalid *flo.ValidationError
	require.ErrorAs(t, err, &invalid)
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Len(t, invalid.Errors(), 1)
	d := invalid.Errors()[0]
	require.Equal(t, "E301", d.Code)
	require.Equal(t, 8, d.Line)
	require.Equal(t, 14, d.Column)
	require.Contains(t, d.Message, "nowhere")
	_, err = c.GetWorkflow(ctx, "broken", "")
	require.Equal(t, codes.NotFound, status.Code(err))

	v, err := c.ValidateWorkflow(ctx, brokenYAML)
	require.NoError(t, err)
	require.False(t, v.Valid)
	require.Equal(t, invalid.Diagnostics, v.Diagnostics, "validate and create find the same problems")
	v, err = c.ValidateWorkflow(ctx, orderYAML)
	require.NoError(t, err)
	require.True(t, v.Valid)
	require.Equal(t, "order", v.Workflow.Name)

	def, warnings, err := c.CreateWorkflow(ctx, orderYAML)
	require.NoError(t, err)
	require.Empty(t, warnings)
	require.Equal(t, "order", def.Name)
	require.True(t, def.Enabled)
	require.True(t, def.Latest)
	_, warnings, err = c.CreateWorkflow(ctx, holdYAML)
	require.NoError(t, err)
	require.Len(t, warnings, 1)
	require.Equal(t, "W501", warnings[0].Code)
	_, _, err = c.CreateWorkflow(ctx, approvalYAML)
	require.NoError(t, err)
	v2 := strings.Replace(orderYAML, `version: "1"`, `version: "2"`, 1)
	_, _, err = c.CreateWorkflow(ctx, v2)
	require.NoError(t, err)

	latest, err := c.GetWorkflow(ctx, "order", "")
	require.NoError(t, err)
	require.Equal(t, "2", latest.Version)
	versions, err := c.ListWorkflows(ctx, flo.ListWorkflowsOptions{Name: "order", AllVersions: true})
	require.NoError(t, err)
	require.Len(t, versions, 2)

	// Start and await, on a pinned version.
	started, err := c.StartWorkflow(ctx, "order", map[string]string{"order_id": "o-1"}, flo.StartWorkflowOptions{Version: "1"})
	require.NoError(t, err)
	require.True(t, started.Created)
	run, err := c.AwaitRun(ctx, started.RunID)
	require.NoError(t, err)
	require.Equal(t, flo.RunCompleted, run.Status)
	require.Equal(t, "1", run.Version)
	require.Equal(t, "flo.Completed", run.Terminal)
	var charged struct {
		Charged struct {
			Order string
			Valid bool
		}
	}
	require.NoError(t, run.Output("charge").Into(&charged))
	require.Equal(t, "o-1", charged.Charged.Order)
	require.True(t, charged.Charged.Valid)

	// The same key, the same run.
	first, err := c.StartWorkflow(ctx, "order", map[string]string{"order_id": "o-2"}, flo.StartWorkflowOptions{IdempotencyKey: "k-2"})
	require.NoError(t, err)
	again, err := c.StartWorkflow(ctx, "order", map[string]string{"order_id": "o-2"}, flo.StartWorkflowOptions{IdempotencyKey: "k-2"})
	require.NoError(t, err)
	require.Equal(t, first.RunID, again.RunID)
	require.False(t, again.Created)
	// The listing below counts it among the completed runs, so it must have finished.
	run, err = c.AwaitRun(ctx, first.RunID)
	require.NoError(t, err)
	require.Equal(t, flo.RunCompleted, run.Status)

	// A signal resumes a waiting run.
	approval, err := c.StartWorkflow(ctx, "approval", map[string]string{"order_id": "o-3"}, flo.StartWorkflowOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, err := c.GetRun(ctx, approval.RunID)
		require.NoError(t, err)
		return r.Status == flo.RunWaiting && r.WaitingFor == "approval"
	}, 30*time.Second, 50*time.Millisecond)
	_, err = c.SignalRun(ctx, approval.RunID, "approval", map[string]string{"decision": "approved"})
	require.NoError(t, err)
	run, err = c.AwaitRun(ctx, approval.RunID)
	require.NoError(t, err)
	require.Equal(t, flo.RunCompleted, run.Status)
	events, err := c.GetRunHistory(ctx, approval.RunID)
	require.NoError(t, err)
	var types []string
	for _, e := range events {
		types = append(types, e.Type)
	}
	require.Equal(t, "workflow_started", types[0])
	require.Contains(t, types, "waiting_for_signal")
	require.Contains(t, types, "signal_received")
	require.Equal(t, "workflow_completed", types[len(types)-1])

	// Cancel a waiting run.
	held, err := c.StartWorkflow(ctx, "hold", nil, flo.StartWorkflowOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, err := c.GetRun(ctx, held.RunID)
		require.NoError(t, err)
		return r.Status == flo.RunWaiting
	}, 30*time.Second, 50*time.Millisecond)
	cancelled, err := c.CancelRun(ctx, held.RunID, "test over")
	require.NoError(t, err)
	require.Equal(t, flo.RunCancelled, cancelled.Status)
	run, err = c.AwaitRun(ctx, held.RunID)
	require.NoError(t, err, "a cancelled run is final")
	require.Equal(t, flo.RunCancelled, run.Status)

	// List with filters and paging.
	completed, next, err := c.ListRuns(ctx, flo.RunFilter{Workflow: "order", Status: flo.RunCompleted, Limit: 1})
	require.NoError(t, err)
	require.Len(t, completed, 1)
	require.NotEmpty(t, next, "two order runs completed")
	seen := map[string]bool{completed[0].ID: true}
	for next != "" {
		var page []*flo.Run
		page, next, err = c.ListRuns(ctx, flo.RunFilter{Workflow: "order", Status: flo.RunCompleted, Limit: 1, PageToken: next})
		require.NoError(t, err)
		for _, r := range page {
			require.False(t, seen[r.ID], "run %s on two pages", r.ID)
			seen[r.ID] = true
			require.Equal(t, "order", r.Workflow)
		}
	}
	require.True(t, seen[started.RunID])
	require.True(t, seen[first.RunID])
	all, _, err := c.ListRuns(ctx, flo.RunFilter{})
	require.NoError(t, err)
	require.Len(t, all, 4)
	none, _, err := c.ListRuns(ctx, flo.RunFilter{CreatedBefore: all[len(all)-1].CreatedAt})
	require.NoError(t, err)
	require.Empty(t, none, "no run is older than the oldest")
	recent, _, err := c.ListRuns(ctx, flo.RunFilter{CreatedAfter: time.Now().Add(-time.Hour), Status: flo.RunCancelled})
	require.NoError(t, err)
	require.Len(t, recent, 1)
	require.Equal(t, held.RunID, recent[0].ID)

	// A disabled workflow refuses starts; enabling lets them through again.
	_, err = c.DisableWorkflow(ctx, "order")
	require.NoError(t, err)
	_, err = c.StartWorkflow(ctx, "order", map[string]string{"order_id": "o-5"}, flo.StartWorkflowOptions{})
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	require.ErrorContains(t, err, "workflow order is disabled")
	_, err = c.EnableWorkflow(ctx, "order")
	require.NoError(t, err)
	_, err = c.StartWorkflow(ctx, "order", map[string]string{"order_id": "o-5"}, flo.StartWorkflowOptions{})
	require.NoError(t, err)
}

func TestWorkflowArgumentValidation(t *testing.T) {
	badJSON := writeFile(t, "bad.json", `{"order_id":`)
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "create without file", args: []string{"workflow", "create"}, wantErr: `required flag(s) "file" not set`},
		{name: "create missing file", args: []string{"workflow", "create", "-f", "/nonexistent/wf.yaml"}, wantErr: "read definition: open /nonexistent/wf.yaml"},
		{name: "validate without file", args: []string{"workflow", "validate"}, wantErr: `required flag(s) "file" not set`},
		{name: "get without name", args: []string{"workflow", "get"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "list with two names", args: []string{"workflow", "list", "a", "b"}, wantErr: "accepts at most 1 arg(s), received 2"},
		{name: "start without name", args: []string{"workflow", "start"}, wantErr: "accepts between 1 and 2 arg(s), received 0"},
		{name: "start invalid JSON", args: []string{"workflow", "start", "order", "{order: 1}"}, wantErr: "--input: invalid JSON payload: invalid character 'o'"},
		{name: "start invalid JSON file", args: []string{"workflow", "start", "order", "-i", "@" + badJSON}, wantErr: "--input: invalid JSON payload: unexpected end of JSON input"},
		{name: "start missing input file", args: []string{"workflow", "start", "order", "-i", "@/nonexistent/in.json"}, wantErr: "--input: open /nonexistent/in.json"},
		{name: "start input twice", args: []string{"workflow", "start", "order", "{}", "--input", "{}"}, wantErr: "not both"},
		{name: "start wait without time", args: []string{"workflow", "start", "order", "--wait", "--timeout", "0s"}, wantErr: "--timeout must be positive"},
		{name: "status without id", args: []string{"workflow", "status"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "signal without type", args: []string{"workflow", "signal", "r-1", "{}"}, wantErr: `required flag(s) "type" not set`},
		{name: "signal invalid JSON", args: []string{"workflow", "signal", "r-1", "--type", "approval", "--data", "yes"}, wantErr: "--data: invalid JSON payload"},
		{name: "signal payload twice", args: []string{"workflow", "signal", "r-1", "{}", "--type", "t", "--data", "{}"}, wantErr: "not both"},
		{name: "cancel without id", args: []string{"workflow", "cancel"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "history without id", args: []string{"workflow", "history"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "disable without name", args: []string{"workflow", "disable"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "enable with two names", args: []string{"workflow", "enable", "a", "b"}, wantErr: "accepts 1 arg(s), received 2"},
		{name: "plans without name", args: []string{"workflow", "plans"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "cache invalidate without event", args: []string{"workflow", "cache", "invalidate"}, wantErr: `required flag(s) "event" not set`},
		{name: "cache invalidate with an argument", args: []string{"workflow", "cache", "invalidate", "x", "--event", "e"}, wantErr: `unknown command "x"`},
		{name: "unknown cache subcommand", args: []string{"workflow", "cache", "clear"}, wantErr: `unknown command "clear" for "flo workflow cache"`},
		{name: "runs unknown status", args: []string{"workflow", "runs", "--status", "done"}, wantErr: `unknown run status "done"`},
		{name: "runs bad time", args: []string{"workflow", "runs", "--since", "yesterday"}, wantErr: `--since "yesterday": want an RFC 3339 time or a positive duration`},
		{name: "runs negative limit", args: []string{"workflow", "runs", "--limit", "-1"}, wantErr: "--limit must not be negative"},
		{name: "unknown workflow subcommand", args: []string{"workflow", "stat", "r-1"}, wantErr: `unknown command "stat" for "flo workflow"; did you mean "start"?`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append(tt.args, "--addr", unreachable)...)
			require.Equal(t, 1, code)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tt.wantErr)
			require.Regexp(t, `^flo: `, stderr)
		})
	}
}

func TestWorkflowGroupAloneShowsItsHelp(t *testing.T) {
	code, stdout, stderr := runCLI(t, "workflow")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "Available Commands:")
	for _, sub := range []string{"create", "validate", "get", "list", "start", "status", "signal", "cancel", "history", "disable", "enable", "runs", "plans", "cache"} {
		require.Regexp(t, regexp.MustCompile(`(?m)^  `+sub+`\s`), stdout, sub)
	}
}

func TestHistoryLine(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.FixedZone("CET", 3600))
	tests := []struct {
		name  string
		event flo.HistoryEvent
		want  string
	}{
		{name: "detail only", event: flo.HistoryEvent{Seq: 1, Type: "workflow_started", Detail: `{"a":1}`, At: at},
			want: `  1  2026-01-02T02:04:05.006Z  workflow_started         {"a":1}`},
		{name: "step and attempt", event: flo.HistoryEvent{Seq: 12, Type: "step_retry", Step: "charge", Attempt: 2, Detail: "boom", At: at},
			want: ` 12  2026-01-02T02:04:05.006Z  step_retry               step=charge  attempt=2  boom`},
		{name: "plan event", event: flo.HistoryEvent{Seq: 7, Type: "plan_executor_exhausted", Step: "_start", Attempt: 3, Detail: "stripe-primary: failure invalid_card", At: at},
			want: `  7  2026-01-02T02:04:05.006Z  plan_executor_exhausted  step=_start  attempt=3  stripe-primary: failure invalid_card`},
		{name: "plan event without executor", event: flo.HistoryEvent{Seq: 4, Type: "plan_cache_hit", Step: "_start", Detail: "charge:c-1:k-9", At: at},
			want: `  4  2026-01-02T02:04:05.006Z  plan_cache_hit           step=_start  charge:c-1:k-9`},
		{name: "nothing else", event: flo.HistoryEvent{Seq: 3, Type: "step_started", At: at},
			want: `  3  2026-01-02T02:04:05.006Z  step_started`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, historyLine(&tt.event))
		})
	}
}
