// Package definition is the workflow language: it parses a workflow's YAML
// into a Definition, checks it, and reports every problem as a Diagnostic
// with a stable code and the line and column it was found at. A Definition
// that Parse returns is valid: every transition goes somewhere that exists,
// every target and mapping is well formed, every policy value is in range.
//
// Inline plans (the plans section and @plan/NAME targets) are parsed into
// Definition.Plans with every default filled in, the schedule section into
// Definition.Schedule, searchAttributes into Definition.SearchAttributes,
// the trigger section into Definition.Trigger.
package definition

import (
	"time"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

// Kind is the only value of the kind field.
const Kind = "Workflow"

// StartStep is the name of the start step: transitions and inputMapping
// paths address it by this name.
const StartStep = mapping.StartStep

// Idempotency says whether a start must carry an idempotency key.
type Idempotency string

// The idempotency modes.
const (
	IdempotencyNone     Idempotency = "none"
	IdempotencyOptional Idempotency = "optional"
	IdempotencyRequired Idempotency = "required"
)

// Status is the final status a terminal gives a run.
type Status string

// The final statuses.
const (
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
	StatusTimedOut  Status = "timed_out"
)

// The built-in terminals.
const (
	TerminalCompleted = "flo.Completed"
	TerminalFailed    = "flo.Failed"
	TerminalCancelled = "flo.Cancelled"
	TerminalTimedOut  = "flo.TimedOut"
)

// BuiltInTerminals maps each built-in terminal to its status.
var BuiltInTerminals = map[string]Status{
	TerminalCompleted: StatusCompleted,
	TerminalFailed:    StatusFailed,
	TerminalCancelled: StatusCancelled,
	TerminalTimedOut:  StatusTimedOut,
}

// Outcomes the engine and actions produce. Any other outcome name is a named
// outcome an action chose (ActionContext.Result).
const (
	OutcomeSuccess = "success"
	OutcomeFailure = "failure"
	OutcomeTimeout = "timeout"
	OutcomePending = "pending"

	// Execution-level outcomes come from the runtime, before the action's
	// own logic ran; they fall back along FallbackChain.
	OutcomeTargetNotFound   = "target_not_found"
	OutcomeTargetDisabled   = "target_disabled"
	OutcomeExecutionFailure = "execution_failure"
)

// Definition is a parsed, valid workflow definition.
type Definition struct {
	Name        string
	Version     string
	Idempotency Idempotency
	// Start is the entry step; its Name is StartStep.
	Start *Step
	// Steps holds the named steps, Start not included.
	Steps map[string]*Step
	// StepOrder lists the named steps as written.
	StepOrder []string
	// Terminals holds the custom terminals; built-ins are not in it.
	Terminals map[string]Terminal
	// Plans holds the inline plans by name.
	Plans map[string]*Plan
	// Schedule starts runs on its own; nil when the workflow has none.
	Schedule *Schedule
	// SearchAttributes are taken from each run's input when it starts.
	SearchAttributes []SearchAttribute
	// Trigger starts runs from a stream's records; nil when the workflow
	// has none.
	Trigger *Trigger
}

// Plan returns the inline plan called name.
func (d *Definition) Plan(name string) (*Plan, bool) {
	p, ok := d.Plans[name]
	return p, ok && p != nil
}

// Step returns the step called name; StartStep is the start step.
func (d *Definition) Step(name string) (*Step, bool) {
	if name == StartStep {
		return d.Start, d.Start != nil
	}
	s, ok := d.Steps[name]
	return s, ok
}

// Terminal returns the terminal called name, custom or built-in.
func (d *Definition) Terminal(name string) (Terminal, bool) {
	if st, ok := BuiltInTerminals[name]; ok {
		return Terminal{Name: name, Status: st, BuiltIn: true}, true
	}
	t, ok := d.Terminals[name]
	return t, ok
}

// Terminal ends a run with a status.
type Terminal struct {
	Name    string
	Status  Status
	BuiltIn bool
	Pos     Position
}

// Step is one node of the workflow graph: it runs a target or waits for a
// signal, then follows the transition its outcome selects.
type Step struct {
	Name string
	Pos  Position
	// Run is the target of a run step; nil on a waitForSignal step.
	Run *Target
	// Wait is set on a waitForSignal step; nil on a run step.
	Wait *WaitForSignal
	// InputMapping builds the target's input; nil passes the run's input.
	InputMapping *mapping.Template
	// Retry re-runs the step on failure; nil means one attempt.
	Retry *Retry
	// Poll re-runs the step while it reports pending; nil means a pending
	// outcome follows the pending transition like any other.
	Poll *Poll
	// Transitions maps an outcome to a step name or terminal name.
	Transitions map[string]string

	transitionPos   map[string]Position
	inputMappingPos Position
	runPos          Position
}

// Next returns where the step goes after outcome: the target, and the
// outcome whose transition matched. Business outcomes (success, failure,
// timeout, pending and named ones) match exactly. Execution-level outcomes
// fall back along FallbackChain, so a target_not_found with no transition of
// its own takes execution_failure's, then failure's. ok is false when no
// transition matches; the engine then fails the run.
func (s *Step) Next(outcome string) (target, matched string, ok bool) {
	for _, o := range FallbackChain(outcome) {
		if t, found := s.Transitions[o]; found {
			return t, o, true
		}
	}
	return "", "", false
}

// FallbackChain lists the transitions tried for an outcome, in order.
func FallbackChain(outcome string) []string {
	switch outcome {
	case OutcomeTargetNotFound, OutcomeTargetDisabled:
		return []string{outcome, OutcomeExecutionFailure, OutcomeFailure}
	case OutcomeExecutionFailure:
		return []string{OutcomeExecutionFailure, OutcomeFailure}
	}
	return []string{outcome}
}

// IsExecutionOutcome reports whether an outcome comes from the runtime
// rather than from the action.
func IsExecutionOutcome(outcome string) bool {
	switch outcome {
	case OutcomeTargetNotFound, OutcomeTargetDisabled, OutcomeExecutionFailure:
		return true
	}
	return false
}

// TargetKind says what a run step invokes.
type TargetKind string

// The target kinds, named by their prefixes.
const (
	TargetAction   TargetKind = "actions"
	TargetWorkflow TargetKind = "workflow"
	TargetPlan     TargetKind = "plan"
)

// Target is what a run step invokes: @actions/NAME, @workflow/NAME[:VERSION]
// or @plan/NAME.
type Target struct {
	Kind TargetKind
	Name string
	// Version pins a child workflow's version; empty means the latest.
	Version string
}

// String renders the target as written in YAML.
func (t Target) String() string {
	s := "@" + string(t.Kind) + "/" + t.Name
	if t.Version != "" {
		s += ":" + t.Version
	}
	return s
}

// WaitForSignal parks a run until a signal of Type arrives.
type WaitForSignal struct {
	Type string
	// Timeout is zero when the step waits forever.
	Timeout time.Duration
	// OnTimeout is where the run goes when Timeout passes; empty ends the
	// run as timed_out.
	OnTimeout string

	onTimeoutPos Position
}

// Defaults of retry and poll blocks, for fields they leave out.
const (
	DefaultRetryMaxAttempts = 3
	DefaultPollMaxAttempts  = 10
	DefaultDelay            = time.Second
	DefaultMaxDelay         = 5 * time.Minute
	DefaultMultiplier       = 2.0
	DefaultBackoff          = backoff.Exponential
)

// Retry is a step's retry policy for failure and execution_failure outcomes.
type Retry struct {
	// MaxAttempts counts every attempt, the first included.
	MaxAttempts  int
	Backoff      backoff.Kind
	InitialDelay time.Duration
	MaxDelay     time.Duration
	Multiplier   float64
	// Within is the total time budget from the first attempt; zero is none.
	Within time.Duration
}

// Policy returns the delay policy of the retry block; exponential_jitter adds
// up to 25% as the language says.
func (r *Retry) Policy() backoff.Policy {
	return backoff.Policy{
		Kind:           r.Backoff,
		Initial:        r.InitialDelay,
		Max:            r.MaxDelay,
		Multiplier:     r.Multiplier,
		JitterFraction: backoff.StepJitter,
		Within:         r.Within,
	}
}

// Poll re-executes a step that reported pending, with its own backoff, until
// it reports something else or MaxAttempts polls were made, when the step's
// outcome becomes timeout.
type Poll struct {
	MaxAttempts int
	Backoff     backoff.Kind
	// InitialDelay is the wait before the first poll.
	InitialDelay time.Duration
	// BaseDelay is where the backoff between later polls starts.
	BaseDelay  time.Duration
	MaxDelay   time.Duration
	Multiplier float64
}

// Policy returns the delay policy between polls.
func (p *Poll) Policy() backoff.Policy {
	return backoff.Policy{
		Kind:           p.Backoff,
		Initial:        p.BaseDelay,
		Max:            p.MaxDelay,
		Multiplier:     p.Multiplier,
		JitterFraction: backoff.StepJitter,
	}
}

// Delay is the wait before poll number n (1 for the first): InitialDelay,
// then the backoff from BaseDelay. draw in [0, 1) is the random draw
// exponential_jitter uses (see backoff.Policy.DelayWithDraw).
func (p *Poll) Delay(n int, draw float64) time.Duration {
	if n <= 1 {
		return p.InitialDelay
	}
	return p.Policy().DelayWithDraw(n-1, draw)
}
