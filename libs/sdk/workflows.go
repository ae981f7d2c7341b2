package flo

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Workflow is one version of a workflow definition.
type Workflow struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Version   string `json:"version"`
	// Idempotency says whether starts take an idempotency key: none, optional or required.
	Idempotency string `json:"idempotency"`
	// StartTarget is what the start step does: the target it runs ("@actions/validate-order")
	// or "waitForSignal:TYPE".
	StartTarget string `json:"start_target"`
	// Steps names the steps after the start step.
	Steps []string `json:"steps"`
	// YAML is the definition as it was created.
	YAML string `json:"yaml,omitempty"`
	// Enabled says whether new runs may start; it applies to every version of the name.
	Enabled bool `json:"enabled"`
	// Latest marks the version a start without a version runs.
	Latest    bool      `json:"latest"`
	CreatedAt time.Time `json:"created_at,omitzero"`
}

// Severity says whether a diagnostic makes a definition invalid.
type Severity string

// The severities of a diagnostic.
const (
	// SeverityError makes the definition invalid: it is not stored.
	SeverityError Severity = "error"
	// SeverityWarning is reported alongside a valid definition.
	SeverityWarning Severity = "warning"
)

// Diagnostic is one problem the server found in a workflow definition.
type Diagnostic struct {
	// Code is stable: E1xx structure, E2xx target references, E3xx transitions, E4xx
	// duplicates, E5xx signals, timers and retry values; W-codes are warnings.
	Code     string   `json:"code"`
	Severity Severity `json:"severity"`
	Message  string   `json:"message"`
	// Line and Column locate the problem in the YAML, 1-based; zero when unknown.
	Line   int `json:"line,omitempty"`
	Column int `json:"column,omitempty"`
	// Path names the place in the definition, for example "steps.charge.retry.backoff".
	Path string `json:"path,omitempty"`
}

// String renders the diagnostic as "LINE:COL CODE PATH: MESSAGE", the position "-" when it is
// unknown, the form compilers use so editors and people can find the place.
func (d Diagnostic) String() string {
	var b strings.Builder
	switch {
	case d.Line == 0:
		b.WriteString("-")
	case d.Column == 0:
		b.WriteString(strconv.Itoa(d.Line))
	default:
		fmt.Fprintf(&b, "%d:%d", d.Line, d.Column)
	}
	b.WriteString(" ")
	b.WriteString(d.Code)
	if d.Path != "" {
		b.WriteString(" ")
		b.WriteString(d.Path)
	}
	b.WriteString(": ")
	b.WriteString(d.Message)
	return b.String()
}

// ValidationError is what [Client.CreateWorkflow] returns for a definition with errors:
// nothing was stored. Diagnostics holds every problem found, warnings included. The gRPC
// status (InvalidArgument) stays reachable through errors.As and status.Code.
type ValidationError struct {
	Diagnostics []Diagnostic
	err         error
}

// maxErrorsInMessage bounds how many errors Error spells out; Diagnostics has them all.
const maxErrorsInMessage = 3

// Error counts the errors and spells out the first few.
func (e *ValidationError) Error() string {
	errs := e.Errors()
	var b strings.Builder
	fmt.Fprintf(&b, "invalid workflow definition (%d error", len(errs))
	if len(errs) != 1 {
		b.WriteString("s")
	}
	b.WriteString(")")
	for i, d := range errs {
		if i == maxErrorsInMessage {
			fmt.Fprintf(&b, "; and %d more", len(errs)-i)
			break
		}
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(d.String())
	}
	return b.String()
}

// Unwrap returns the gRPC status error the server sent.
func (e *ValidationError) Unwrap() error { return e.err }

// Errors returns the diagnostics with severity error.
func (e *ValidationError) Errors() []Diagnostic {
	var out []Diagnostic
	for _, d := range e.Diagnostics {
		if d.Severity == SeverityError {
			out = append(out, d)
		}
	}
	return out
}

// Validation is the verdict of [Client.ValidateWorkflow].
type Validation struct {
	Valid       bool         `json:"valid"`
	Diagnostics []Diagnostic `json:"diagnostics"`
	// Workflow is the definition as it would be stored, when valid.
	Workflow *Workflow `json:"workflow,omitempty"`
}

// ListWorkflowsOptions choose what [Client.ListWorkflows] returns.
type ListWorkflowsOptions struct {
	// Name limits the list to one workflow; empty lists every workflow.
	Name string
	// AllVersions lists every version instead of the latest of each name.
	AllVersions bool
}

// RunStatus is where a workflow run is in its life.
type RunStatus string

// The states of a run. Completed, failed, cancelled and timed out are final.
const (
	RunPending   RunStatus = "pending"
	RunRunning   RunStatus = "running"
	RunWaiting   RunStatus = "waiting"
	RunCompleted RunStatus = "completed"
	RunFailed    RunStatus = "failed"
	RunCancelled RunStatus = "cancelled"
	RunTimedOut  RunStatus = "timed_out"
)

var runStatuses = map[flov1.RunStatus]RunStatus{
	flov1.RunStatus_RUN_STATUS_PENDING:   RunPending,
	flov1.RunStatus_RUN_STATUS_RUNNING:   RunRunning,
	flov1.RunStatus_RUN_STATUS_WAITING:   RunWaiting,
	flov1.RunStatus_RUN_STATUS_COMPLETED: RunCompleted,
	flov1.RunStatus_RUN_STATUS_FAILED:    RunFailed,
	flov1.RunStatus_RUN_STATUS_CANCELLED: RunCancelled,
	flov1.RunStatus_RUN_STATUS_TIMED_OUT: RunTimedOut,
}

// Final reports whether the run has ended and will not change any more.
func (s RunStatus) Final() bool {
	return s == RunCompleted || s == RunFailed || s == RunCancelled || s == RunTimedOut
}

// ParseRunStatus returns the status named s, or an error naming the statuses that exist.
func ParseRunStatus(s string) (RunStatus, error) {
	for _, st := range runStatuses {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("unknown run status %q (want pending, running, waiting, completed, failed, cancelled or timed_out)", s)
}

func (s RunStatus) toProto() flov1.RunStatus {
	for p, st := range runStatuses {
		if st == s {
			return p
		}
	}
	return flov1.RunStatus_RUN_STATUS_UNSPECIFIED
}

// StepOutput is what one step of a run ended with, as its last attempt saw it.
type StepOutput struct {
	Step string
	// Outcome is the outcome the step's transition followed: success, failure, a named
	// outcome, and so on.
	Outcome    string
	Output     []byte
	Attempts   int
	FinishedAt time.Time
}

// Into decodes the step's JSON output into v. An empty output leaves v as it is.
func (o *StepOutput) Into(v any) error {
	if len(o.Output) == 0 {
		return nil
	}
	if err := json.Unmarshal(o.Output, v); err != nil {
		return fmt.Errorf("decode output of step %s: %w", o.Step, err)
	}
	return nil
}

// MarshalJSON writes the output as a JSON value when it holds JSON and as a base64 string
// otherwise, like [Task.MarshalJSON].
func (o StepOutput) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Step       string          `json:"step"`
		Outcome    string          `json:"outcome,omitempty"`
		Output     json.RawMessage `json:"output,omitempty"`
		Attempts   int             `json:"attempts"`
		FinishedAt time.Time       `json:"finished_at,omitzero"`
	}{o.Step, o.Outcome, jsonOrBase64(o.Output), o.Attempts, o.FinishedAt})
}

// Run is one execution of a workflow version.
type Run struct {
	ID        string
	Namespace string
	Workflow  string
	Version   string
	Status    RunStatus
	// CurrentStep is the step the run is at; empty once it ended.
	CurrentStep string
	// Terminal is the terminal the run ended at: built-in (flo.Completed) or custom.
	Terminal string
	Input    []byte
	// Outputs are the steps that finished, in the order they finished.
	Outputs []StepOutput
	// Error says why a failed run failed.
	Error          string
	IdempotencyKey string
	// ParentRunID is set on a child run started by a @workflow/ step.
	ParentRunID string
	// WaitingFor is the signal type a waiting run waits for.
	WaitingFor string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time
	// StartedBy says who started the run: client, schedule, trigger (a stream trigger) or
	// workflow (a parent run).
	StartedBy string
	// ScheduledFor is the schedule's tick that started the run; zero unless StartedBy is
	// schedule.
	ScheduledFor time.Time
	// SearchAttributes are the attributes the run took from its input, by name; see
	// [Run.SearchAttribute].
	SearchAttributes []SearchAttribute
}

// Output returns the output of step, or nil when the step has not finished.
func (r *Run) Output(step string) *StepOutput {
	for i := range r.Outputs {
		if r.Outputs[i].Step == step {
			return &r.Outputs[i]
		}
	}
	return nil
}

// MarshalJSON writes the run as `flo workflow status` prints it: input and outputs as JSON
// values, empty fields and zero times left out.
func (r Run) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID             string          `json:"run_id"`
		Namespace      string          `json:"namespace"`
		Workflow       string          `json:"workflow"`
		Version        string          `json:"version"`
		Status         RunStatus       `json:"status"`
		CurrentStep    string          `json:"current_step,omitempty"`
		Terminal       string          `json:"terminal,omitempty"`
		Input          json.RawMessage `json:"input,omitempty"`
		Outputs        []StepOutput    `json:"outputs"`
		Error          string          `json:"error,omitempty"`
		IdempotencyKey string          `json:"idempotency_key,omitempty"`
		ParentRunID    string          `json:"parent_run_id,omitempty"`
		WaitingFor     string          `json:"waiting_for,omitempty"`
		CreatedAt      time.Time       `json:"created_at,omitzero"`
		UpdatedAt      time.Time       `json:"updated_at,omitzero"`
		FinishedAt     time.Time       `json:"finished_at,omitzero"`
		StartedBy      string          `json:"started_by,omitempty"`
		ScheduledFor   time.Time       `json:"scheduled_for,omitzero"`
		Attributes     map[string]any  `json:"search_attributes,omitempty"`
	}{
		ID: r.ID, Namespace: r.Namespace, Workflow: r.Workflow, Version: r.Version, Status: r.Status,
		CurrentStep: r.CurrentStep, Terminal: r.Terminal, Input: jsonOrBase64(r.Input),
		Outputs: append([]StepOutput{}, r.Outputs...), Error: r.Error, IdempotencyKey: r.IdempotencyKey,
		ParentRunID: r.ParentRunID, WaitingFor: r.WaitingFor,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, FinishedAt: r.FinishedAt,
		StartedBy: r.StartedBy, ScheduledFor: r.ScheduledFor, Attributes: searchAttributesJSON(r.SearchAttributes),
	})
}

// HistoryEvent is one entry of a run's history: workflow_started, step_started,
// step_completed, step_retry, waiting_for_signal, signal_received, signal_matched,
// signal_timeout, action_not_found, action_disabled, awaiting_action, action_waiting, action_completed,
// poll_scheduled, child_started, child_completed, schedule_fired, trigger_fired, the run's end (workflow_completed,
// workflow_failed, workflow_cancelled, workflow_timed_out), and a plan step's plan_executor_start,
// plan_executor_success, plan_executor_retry, plan_executor_exhausted, plan_breaker_skip,
// plan_rate_limited, plan_rate_wait, plan_cache_hit, plan_cache_miss, plan_cache_skipped and
// plan_fallback, whose Detail names the executor first when the event is about one.
type HistoryEvent struct {
	// Seq orders the events of a run, from 1.
	Seq    int64  `json:"seq"`
	Type   string `json:"type"`
	Step   string `json:"step,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Attempt is the step's attempt the event belongs to, when it belongs to one.
	Attempt int       `json:"attempt,omitempty"`
	At      time.Time `json:"at,omitzero"`
}

// StartWorkflowOptions adjust one [Client.StartWorkflow] call.
type StartWorkflowOptions struct {
	// Version runs that version; empty runs the latest.
	Version string
	// IdempotencyKey makes the start idempotent: starting the same workflow with the same key
	// again returns the run the first start created instead of creating another.
	IdempotencyKey string
}

// StartedRun is what [Client.StartWorkflow] returns.
type StartedRun struct {
	RunID string `json:"run_id"`
	// Created is false when the idempotency key returned an existing run.
	Created bool `json:"created"`
}

// RunFilter chooses what [Client.ListRuns] returns. The zero value lists the namespace's
// newest runs, up to the server's default count (100).
type RunFilter struct {
	// Workflow limits the list to runs of one workflow; empty lists every workflow's runs.
	Workflow string
	// Status limits the list to runs in one state; empty lists every state.
	Status RunStatus
	// CreatedAfter and CreatedBefore bound the runs' creation times; zero leaves that side
	// open.
	CreatedAfter  time.Time
	CreatedBefore time.Time
	// Limit is the most runs to return (at most 1,000); zero means 100.
	Limit int
	// PageToken continues a list where the previous call ended: pass the next token it
	// returned.
	PageToken string
	// Where is a query over search attributes and the built-in fields workflow, status,
	// started_at and finished_at: customer_id = "c-42" AND order_amount > 100. It has =, !=,
	// <, <=, >, >=, IN ("a", "b"), AND (binding tighter), OR and parentheses; timestamps are
	// RFC 3339 strings or epoch milliseconds. Empty matches every run.
	Where string
}

func (c *Client) workflowService() (flov1.WorkflowServiceClient, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	return flov1.NewWorkflowServiceClient(conn), nil
}

// CreateWorkflow validates the YAML definition and stores it as a new version of its
// workflow in the client's namespace. It returns the stored version and the warnings the
// validator found. A definition with errors is not stored: the error is a [*ValidationError]
// listing every diagnostic.
func (c *Client) CreateWorkflow(ctx context.Context, yaml string) (*Workflow, []Diagnostic, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, nil, err
	}
	resp, err := svc.CreateWorkflow(ctx, &flov1.CreateWorkflowRequest{Namespace: c.namespace, Yaml: yaml})
	if err != nil {
		if invalid := validationErrorFrom(err); invalid != nil {
			return nil, nil, invalid
		}
		return nil, nil, fmt.Errorf("create workflow: %w", err)
	}
	return workflowFromProto(resp.GetWorkflow()), diagnosticsFromProto(resp.GetWarnings()), nil
}

// ValidateWorkflow checks the YAML definition as [Client.CreateWorkflow] would and stores
// nothing. An invalid definition is a verdict, not an error: see [Validation.Valid].
func (c *Client) ValidateWorkflow(ctx context.Context, yaml string) (*Validation, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	resp, err := svc.ValidateWorkflow(ctx, &flov1.ValidateWorkflowRequest{Namespace: c.namespace, Yaml: yaml})
	if err != nil {
		return nil, fmt.Errorf("validate workflow: %w", err)
	}
	v := &Validation{Valid: resp.GetValid(), Diagnostics: diagnosticsFromProto(resp.GetDiagnostics())}
	if resp.GetWorkflow() != nil {
		v.Workflow = workflowFromProto(resp.GetWorkflow())
	}
	return v, nil
}

// GetWorkflow returns version of the workflow name, the latest version when version is
// empty.
func (c *Client) GetWorkflow(ctx context.Context, name, version string) (*Workflow, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	w, err := svc.GetWorkflow(ctx, &flov1.GetWorkflowRequest{Namespace: c.namespace, Name: name, Version: version})
	if err != nil {
		if version != "" {
			return nil, fmt.Errorf("get workflow %s version %s: %w", name, version, err)
		}
		return nil, fmt.Errorf("get workflow %s: %w", name, err)
	}
	return workflowFromProto(w), nil
}

// ListWorkflows returns the client's namespace's workflows as opts choose: by default the
// latest version of each.
func (c *Client) ListWorkflows(ctx context.Context, opts ListWorkflowsOptions) ([]*Workflow, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	return listPages(0, func(size int32, token string) ([]*flov1.WorkflowDefinition, string, error) {
		resp, err := svc.ListWorkflows(ctx, &flov1.ListWorkflowsRequest{
			Namespace: c.namespace, Name: opts.Name, AllVersions: opts.AllVersions, Limit: size, PageToken: token,
		})
		if err != nil {
			return nil, "", fmt.Errorf("list workflows: %w", err)
		}
		return resp.GetWorkflows(), resp.GetNextPageToken(), nil
	}, workflowFromProto)
}

// DisableWorkflow refuses new starts of every version of the workflow name until
// [Client.EnableWorkflow]; runs already under way go on. It returns the latest version.
func (c *Client) DisableWorkflow(ctx context.Context, name string) (*Workflow, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	w, err := svc.DisableWorkflow(ctx, &flov1.WorkflowNameRequest{Namespace: c.namespace, Name: name})
	if err != nil {
		return nil, fmt.Errorf("disable workflow %s: %w", name, err)
	}
	return workflowFromProto(w), nil
}

// EnableWorkflow lets new runs of the workflow name start again. It returns the latest
// version.
func (c *Client) EnableWorkflow(ctx context.Context, name string) (*Workflow, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	w, err := svc.EnableWorkflow(ctx, &flov1.WorkflowNameRequest{Namespace: c.namespace, Name: name})
	if err != nil {
		return nil, fmt.Errorf("enable workflow %s: %w", name, err)
	}
	return workflowFromProto(w), nil
}

// StartWorkflow starts a run of the workflow name with input as its $.input. A []byte or
// json.RawMessage input is sent as it is, nil sends no input, and anything else is encoded as
// JSON. A disabled workflow refuses the start (FailedPrecondition). With an idempotency key, a
// start the gateway answers UNAVAILABLE is sent again, as Invoke does.
func (c *Client) StartWorkflow(ctx context.Context, name string, input any, opts StartWorkflowOptions) (*StartedRun, error) {
	body, err := encodePayload(input)
	if err != nil {
		return nil, fmt.Errorf("start workflow %s: input: %w", name, err)
	}
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	req := &flov1.StartRunRequest{
		Namespace:      c.namespace,
		Workflow:       name,
		Version:        opts.Version,
		Input:          body,
		IdempotencyKey: opts.IdempotencyKey,
	}
	resp, err := retryKeyed(ctx, opts.IdempotencyKey, func() (*flov1.StartRunResponse, error) {
		return svc.StartRun(ctx, req)
	})
	if err != nil {
		return nil, fmt.Errorf("start workflow %s: %w", name, err)
	}
	return &StartedRun{RunID: resp.GetRunId(), Created: resp.GetCreated()}, nil
}

// GetRun returns the run id as it is now.
func (c *Client) GetRun(ctx context.Context, id string) (*Run, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	r, err := svc.GetRun(ctx, &flov1.GetRunRequest{Namespace: c.namespace, RunId: id})
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	return runFromProto(r), nil
}

// ListRuns returns the client's namespace's runs that match filter, newest first, and next:
// the page token that continues the list, empty when there is nothing more.
func (c *Client) ListRuns(ctx context.Context, filter RunFilter) (runs []*Run, next string, err error) {
	req := &flov1.ListRunsRequest{
		Namespace: c.namespace,
		Workflow:  filter.Workflow,
		Limit:     int32(filter.Limit),
		PageToken: filter.PageToken,
		Where:     filter.Where,
	}
	if filter.Status != "" {
		if req.Status = filter.Status.toProto(); req.Status == flov1.RunStatus_RUN_STATUS_UNSPECIFIED {
			_, err := ParseRunStatus(string(filter.Status))
			return nil, "", fmt.Errorf("list runs: %w", err)
		}
	}
	if !filter.CreatedAfter.IsZero() {
		req.CreatedAfter = timestamppb.New(filter.CreatedAfter)
	}
	if !filter.CreatedBefore.IsZero() {
		req.CreatedBefore = timestamppb.New(filter.CreatedBefore)
	}
	svc, err := c.workflowService()
	if err != nil {
		return nil, "", err
	}
	resp, err := svc.ListRuns(ctx, req)
	if err != nil {
		return nil, "", fmt.Errorf("list runs: %w", err)
	}
	runs = make([]*Run, 0, len(resp.GetRuns()))
	for _, r := range resp.GetRuns() {
		runs = append(runs, runFromProto(r))
	}
	return runs, resp.GetNextPageToken(), nil
}

// SignalRun sends the run id a signal of signalType with payload, encoded as
// [Client.StartWorkflow] encodes its input, and returns the signal's id. A step waiting for
// that type resumes; otherwise the signal is kept for a later step that waits for it.
func (c *Client) SignalRun(ctx context.Context, id, signalType string, payload any) (string, error) {
	body, err := encodePayload(payload)
	if err != nil {
		return "", fmt.Errorf("signal run %s: payload: %w", id, err)
	}
	svc, err := c.workflowService()
	if err != nil {
		return "", err
	}
	resp, err := svc.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: c.namespace, RunId: id, Type: signalType, Payload: body})
	if err != nil {
		return "", fmt.Errorf("signal run %s with %s: %w", id, signalType, err)
	}
	return resp.GetSignalId(), nil
}

// CancelRun ends the run id as cancelled, with the children it waits for, and returns it.
func (c *Client) CancelRun(ctx context.Context, id, reason string) (*Run, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	r, err := svc.CancelRun(ctx, &flov1.CancelRunRequest{Namespace: c.namespace, RunId: id, Reason: reason})
	if err != nil {
		return nil, fmt.Errorf("cancel run %s: %w", id, err)
	}
	return runFromProto(r), nil
}

// GetRunHistory returns the history of the run id, oldest event first.
func (c *Client) GetRunHistory(ctx context.Context, id string) ([]*HistoryEvent, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	resp, err := svc.GetRunHistory(ctx, &flov1.GetRunRequest{Namespace: c.namespace, RunId: id})
	if err != nil {
		return nil, fmt.Errorf("get history of run %s: %w", id, err)
	}
	out := make([]*HistoryEvent, 0, len(resp.GetEvents()))
	for _, e := range resp.GetEvents() {
		out = append(out, &HistoryEvent{
			Seq:     e.GetSeq(),
			Type:    e.GetType(),
			Step:    e.GetStep(),
			Detail:  e.GetDetail(),
			Attempt: int(e.GetAttempt()),
			At:      timeFromProto(e.GetAt()),
		})
	}
	return out, nil
}

// The polling of AwaitRun starts quick, for the short runs people wait on from a terminal,
// and slows down to a read per second for long ones.
const (
	awaitRunFirstPoll = 50 * time.Millisecond
	awaitRunMaxPoll   = time.Second
)

// AwaitRun waits until the run id reaches a final status ([RunStatus.Final]) and returns it.
// It reads the run, more and more slowly up to once a second; a gateway that is briefly
// unavailable is waited out. Bound the wait with ctx: when it ends first, AwaitRun returns the
// run as it last saw it (nil if it never read it) with an error wrapping ctx's.
func (c *Client) AwaitRun(ctx context.Context, id string) (*Run, error) {
	var last *Run
	waits := newBackoff(awaitRunFirstPoll, awaitRunMaxPoll)
	for {
		run, err := c.GetRun(ctx, id)
		switch {
		case err == nil:
			if run.Status.Final() {
				return run, nil
			}
			last = run
		case ctx.Err() != nil:
			// The read failed because the wait is over; the answer below says so.
		case status.Code(err) != codes.Unavailable:
			return last, fmt.Errorf("await run %s: %w", id, err)
		}
		t := time.NewTimer(waits.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			if last != nil {
				return last, fmt.Errorf("await run %s: still %s: %w", id, last.Status, ctx.Err())
			}
			return nil, fmt.Errorf("await run %s: %w", id, ctx.Err())
		case <-t.C:
		}
	}
}

func workflowFromProto(w *flov1.WorkflowDefinition) *Workflow {
	if w == nil {
		return nil
	}
	return &Workflow{
		Namespace:   w.GetNamespace(),
		Name:        w.GetName(),
		Version:     w.GetVersion(),
		Idempotency: w.GetIdempotency(),
		StartTarget: w.GetStartTarget(),
		Steps:       w.GetSteps(),
		YAML:        w.GetYaml(),
		Enabled:     w.GetEnabled(),
		Latest:      w.GetLatest(),
		CreatedAt:   timeFromProto(w.GetCreatedAt()),
	}
}

func diagnosticsFromProto(ds []*flov1.Diagnostic) []Diagnostic {
	out := make([]Diagnostic, 0, len(ds))
	for _, d := range ds {
		sev := SeverityError
		if d.GetSeverity() == flov1.DiagnosticSeverity_DIAGNOSTIC_SEVERITY_WARNING {
			sev = SeverityWarning
		}
		out = append(out, Diagnostic{
			Code:     d.GetCode(),
			Severity: sev,
			Message:  d.GetMessage(),
			Line:     int(d.GetLine()),
			Column:   int(d.GetColumn()),
			Path:     d.GetPath(),
		})
	}
	return out
}

// validationErrorFrom reads the diagnostics of a rejected definition out of err, or returns
// nil when err is not such a rejection. The server sends each diagnostic as a field violation
// of an InvalidArgument status: the code as its reason, the path as its field, and the
// description "CODE[ line L[:C]][ PATH]: MESSAGE".
func validationErrorFrom(err error) *ValidationError {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		return nil
	}
	var out *ValidationError
	for _, detail := range st.Details() {
		br, ok := detail.(*errdetails.BadRequest)
		if !ok {
			continue
		}
		for _, v := range br.GetFieldViolations() {
			if out == nil {
				out = &ValidationError{err: err}
			}
			out.Diagnostics = append(out.Diagnostics, diagnosticFromViolation(v))
		}
	}
	return out
}

func diagnosticFromViolation(v *errdetails.BadRequest_FieldViolation) Diagnostic {
	d := Diagnostic{Code: v.GetReason(), Path: v.GetField(), Severity: SeverityError, Message: v.GetDescription()}
	if strings.HasPrefix(d.Code, "W") {
		d.Severity = SeverityWarning
	}
	rest, ok := strings.CutPrefix(v.GetDescription(), d.Code)
	if !ok {
		return d
	}
	if after, ok := strings.CutPrefix(rest, " line "); ok {
		d.Line, rest = leadingNumber(after)
		if after, ok := strings.CutPrefix(rest, ":"); ok && after != "" && after[0] >= '0' && after[0] <= '9' {
			d.Column, rest = leadingNumber(after)
		}
	}
	if d.Path != "" {
		rest = strings.TrimPrefix(rest, " "+d.Path)
	}
	if msg, ok := strings.CutPrefix(rest, ": "); ok {
		d.Message = msg
	}
	return d
}

// leadingNumber splits the decimal number s starts with from the rest of s.
func leadingNumber(s string) (int, string) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	n, _ := strconv.Atoi(s[:i])
	return n, s[i:]
}

func runFromProto(r *flov1.WorkflowRun) *Run {
	out := &Run{
		ID:             r.GetRunId(),
		Namespace:      r.GetNamespace(),
		Workflow:       r.GetWorkflow(),
		Version:        r.GetVersion(),
		Status:         runStatuses[r.GetStatus()],
		CurrentStep:    r.GetCurrentStep(),
		Terminal:       r.GetTerminal(),
		Input:          jsonBytes(r.GetInput(), r.GetInputValue()),
		Error:          r.GetError(),
		IdempotencyKey: r.GetIdempotencyKey(),
		ParentRunID:    r.GetParentRunId(),
		WaitingFor:     r.GetWaitingFor(),
		CreatedAt:      timeFromProto(r.GetCreatedAt()),
		UpdatedAt:      timeFromProto(r.GetUpdatedAt()),
		FinishedAt:     timeFromProto(r.GetFinishedAt()),
		StartedBy:      r.GetStartedBy(),
		ScheduledFor:   timeFromProto(r.GetScheduledFor()),

		SearchAttributes: searchAttributesFromProto(r.GetSearchAttributes()),
	}
	for _, o := range r.GetOutputs() {
		out.Outputs = append(out.Outputs, StepOutput{
			Step:       o.GetStep(),
			Outcome:    o.GetOutcome(),
			Output:     jsonBytes(o.GetOutput(), o.GetOutputValue()),
			Attempts:   int(o.GetAttempts()),
			FinishedAt: timeFromProto(o.GetFinishedAt()),
		})
	}
	return out
}

// jsonBytes returns a field's raw bytes, or its JSON value encoded when only that was sent:
// the server may fill in either, and a Go caller finds the JSON in one place.
func jsonBytes(raw []byte, v *structpb.Value) []byte {
	if len(raw) > 0 || v == nil {
		return raw
	}
	b, err := v.MarshalJSON()
	if err != nil {
		return nil
	}
	return b
}
