package engine

import (
	"encoding/json"
	"time"
)

// Status is a run's lifecycle state.
type Status string

// The run statuses of the workflow language.
const (
	StatusPending   Status = "pending"
	StatusRunning   Status = "running"
	StatusWaiting   Status = "waiting"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
	StatusTimedOut  Status = "timed_out"
)

// Ended reports whether s is a final status: nothing moves the run any more.
func (s Status) Ended() bool {
	switch s {
	case StatusCompleted, StatusFailed, StatusCancelled, StatusTimedOut:
		return true
	}
	return false
}

// WaitKind says what a run that is not running a step right now waits for.
type WaitKind string

// The things a run can wait for. WaitNone is the state of a run that has not
// started or has ended.
const (
	WaitNone   WaitKind = ""
	WaitTask   WaitKind = "task"
	WaitChild  WaitKind = "child"
	WaitSignal WaitKind = "signal"
	WaitRetry  WaitKind = "retry"
	WaitPoll   WaitKind = "poll"
)

// Run is a run's durable state; the store persists every field.
type Run struct {
	ID, Namespace, Workflow, Version string
	Status                           Status
	// Step is the current step; the start step is "_start".
	Step string
	// Attempt is the attempt of the current step visit, 1-based.
	Attempt int
	// Polls counts the poll attempts made in the current step visit.
	Polls int
	// VisitStarted is when the current step visit began; within_ms budgets
	// are measured from it.
	VisitStarted time.Time
	Wait         WaitKind
	// Token identifies what the run waits for; events carrying another
	// token are stale. It is a decimal counter that grows with every wait,
	// so it also numbers the run's invocations (see taskID); it is kept
	// after the run ends.
	Token string
	// WaitingFor is the signal type when Wait is WaitSignal.
	WaitingFor string
	// Deadline is the signal timeout, zero when none.
	Deadline time.Time
	// Terminal is the terminal the run ended in.
	Terminal string
	Input    json.RawMessage
	// Outputs holds the result of every step that finished, by step name;
	// a step visited twice keeps its latest result.
	Outputs map[string]StepResult
	// Plan is the progress of the current visit of a plan step; nil
	// outside plan steps.
	Plan *PlanProgress `json:",omitempty"`
	// Error says why a failed run failed.
	Error                            string
	ParentRunID, ParentToken         string
	CreatedAt, UpdatedAt, FinishedAt time.Time
	// ScheduledFor is the tick of the schedule that started the run; zero
	// when a client or a parent did.
	ScheduledFor time.Time `json:",omitzero"`
	// TriggerRecord is the id of the stream record (the first, for a
	// batch) whose trigger started the run; empty otherwise.
	TriggerRecord string `json:",omitempty"`
}

// StepResult is what a finished step visit left behind.
type StepResult struct {
	Outcome    string
	Output     json.RawMessage
	Attempts   int
	FinishedAt time.Time
	// Error is the error of the last attempt when it failed (added to the
	// contract: the status and inputMapping errors need somewhere to go).
	Error string `json:",omitempty"`
	// ErrorCode is the code the worker gave the last attempt's failure.
	ErrorCode string `json:",omitempty"`
}

// Started starts a pending run.
type Started struct{}

// TaskEnded is the end of a task the run invoked.
//
// Outcome is "success", a named outcome or "pending" for COMPLETED;
// "failure" for FAILED and DEAD_LETTERED; "target_not_found" or
// "target_disabled" for REJECTED.
//
// TimedOut says a failed task's last attempt ran out of time (its handler
// passed its deadline, or its lease expired): the step's outcome is then
// "timeout", which is retried like a failure and takes the failure
// transition when the step has no timeout transition.
type TaskEnded struct {
	Token, Outcome string
	Output         json.RawMessage
	Error          string
	NonRetryable   bool
	TimedOut       bool
	// ErrorCode is the code the worker gave the task's failure (FAILED and
	// DEAD_LETTERED); the step's error and history name it.
	ErrorCode string
}

// TaskWaiting says the handler of the task the run waits for answered that
// its result comes later, by completion token: the run shows as waiting until
// the task ends (TaskEnded).
type TaskWaiting struct{ Token string }

// SignalArrived is a signal delivered to the run. The store stores it first
// and lists it in Env.Pending; only signals in Env.Pending are matched, so a
// redelivered signal that was consumed already is recorded but not matched
// again.
type SignalArrived struct{ Signal Signal }

// TimerFired is a durable timer of the run coming due.
type TimerFired struct{ Token string }

// ChildEnded is the end of a child run the run waits for.
type ChildEnded struct {
	Token  string
	Status Status
	Output json.RawMessage
}

// Cancel cancels the run.
type Cancel struct{ Reason string }

// Signal is a typed external event sent to a run.
type Signal struct {
	ID, Type   string
	Payload    json.RawMessage
	ReceivedAt time.Time
}

// Effects are what the store applies in the same transaction as the new Run.
type Effects struct {
	// Invokes are InvokeTask commands to write to the outbox.
	Invokes []Invoke
	// Children are child runs to create and start; the parent waits for
	// them with their ParentToken.
	Children []ChildStart
	// Timers are durable timers to set; an advance that sets timers
	// replaces the run's previous ones.
	Timers []Timer
	// ClearTimers drops the run's timers; set when the run leaves a timed
	// wait without setting a new timer.
	ClearTimers bool
	// ConsumedSignals are the ids of signals used up.
	ConsumedSignals []string
	History         []HistoryEvent
	// Ended says the run reached a terminal: notify the parent with
	// ChildEnded if there is one.
	Ended bool
	// PlanEvents feed the replica's plan health, breakers and metrics once
	// the transaction commits.
	PlanEvents []PlanEvent
	// CacheWrites are plan outcomes to store in the cache.
	CacheWrites []CacheWrite
}

// Invoke is an InvokeTask command.
type Invoke struct {
	TaskID, Action string
	Payload        json.RawMessage
	Origin         string
	// MaxAttempts is 1 when the step has its own retry block (the step's
	// policy governs) and 0 (the action's policy) otherwise.
	MaxAttempts int32
}

// ChildStart is a child run to create and start.
type ChildStart struct {
	RunID, Workflow string
	// Version is the pinned version, empty for the latest.
	Version     string
	Input       json.RawMessage
	ParentToken string
}

// Timer is a durable timer; when due, the store advances the run with
// TimerFired{Token}.
type Timer struct {
	Token string
	At    time.Time
	// Kind is WaitRetry, WaitPoll or WaitSignal.
	Kind WaitKind
}

// HistoryEvent is one entry of a run's history.
type HistoryEvent struct {
	Type, Step, Detail string
	Attempt            int
	At                 time.Time
}

// The history event types: the workflow language's table plus
// poll_scheduled, child_started, child_completed, schedule_fired and
// trigger_fired.
const (
	HistoryWorkflowStarted   = "workflow_started"
	HistoryStepStarted       = "step_started"
	HistoryStepCompleted     = "step_completed"
	HistoryStepRetry         = "step_retry"
	HistoryWaitingForSignal  = "waiting_for_signal"
	HistorySignalReceived    = "signal_received"
	HistorySignalMatched     = "signal_matched"
	HistorySignalTimeout     = "signal_timeout"
	HistoryActionNotFound    = "action_not_found"
	HistoryActionDisabled    = "action_disabled"
	HistoryAwaitingAction    = "awaiting_action"
	HistoryActionCompleted   = "action_completed"
	HistoryActionWaiting     = "action_waiting"
	HistoryWorkflowCompleted = "workflow_completed"
	HistoryWorkflowFailed    = "workflow_failed"
	HistoryWorkflowCancelled = "workflow_cancelled"
	HistoryWorkflowTimedOut  = "workflow_timed_out"
	HistoryPollScheduled     = "poll_scheduled"
	HistoryChildStarted      = "child_started"
	HistoryChildCompleted    = "child_completed"
	// HistoryScheduleFired opens the history of a run a schedule started;
	// its detail is the tick.
	HistoryScheduleFired = "schedule_fired"
	// HistoryTriggerFired opens the history of a run a stream trigger
	// started; its detail is the record id (the first, for a batch).
	HistoryTriggerFired = "trigger_fired"
)

// Env is what an advance may read besides the run and its definition.
type Env struct {
	Now time.Time
	// Rand returns a number in [0, 1) for exponential_jitter; nil means no
	// jitter is drawn (the jitter is zero).
	Rand func() float64
	// Pending are the run's unconsumed signals, oldest first.
	Pending []Signal
	// NewID returns child run ids.
	NewID func() string
	// MaxPayloadBytes bounds a step input an inputMapping builds; one that
	// would be larger fails the step. Zero means mapping.DefaultMaxBytes.
	MaxPayloadBytes int
	// Plans answers plan steps' questions; nil tries executors in
	// priority order, admits every attempt and caches nothing.
	Plans PlanGate
}
