// Package engine is the workflow state machine: given a run, its definition
// and one event (the run started, a task ended, a signal arrived, a timer
// fired, a child run ended, the run was cancelled), Advance moves the run
// through its steps until it waits for something or ends, and says what the
// store must do in the same transaction: tasks to invoke, child runs to
// start, timers to set, signals used up and history to append.
//
// The engine does no I/O, reads no clock and draws no randomness of its own
// (Env brings the time, random draws and child run ids), so the same run,
// definition, event and Env always give the same result. That is what lets
// the runtime apply an advance and its effects atomically and redo it after a
// crash without a step's transition being lost or repeated.
package engine

import (
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

// MaxAdvanceSteps bounds how many steps one Advance may enter. Steps that
// finish without waiting (a matched signal, an inputMapping error) can form
// a loop; the guard turns it into a failed run instead of a hung consumer.
const MaxAdvanceSteps = 256

// StartStep is the name of the start step.
const StartStep = definition.StartStep

// OriginPrefix starts the origin of every task the engine invokes; the
// runtime recognises its own tasks' events by it. The full origin is
// OriginPrefix + run id + ":" + token.
const OriginPrefix = "workflow:"

// taskIDSpace is the UUID namespace of task ids derived from runs, so that
// redoing an advance invokes the same task id and the dispatcher's
// idempotent intake absorbs the duplicate.
var taskIDSpace = uuid.MustParse("6f1c3a52-0d7e-4b8e-9a51-3c2f4e7d9b10")

// TaskID is the id of the task a run invokes in step with token: the same
// inputs always give the same id.
func TaskID(runID, step, token string) string {
	return uuid.NewSHA1(taskIDSpace, []byte(runID+"/"+step+"/"+token)).String()
}

// Origin is the InvokeTask origin of the run's task waited for with token.
func Origin(runID, token string) string {
	return OriginPrefix + runID + ":" + token
}

// ParseOrigin splits an origin made by Origin into run id and token; ok is
// false for origins the engine did not make.
func ParseOrigin(origin string) (runID, token string, ok bool) {
	rest, found := strings.CutPrefix(origin, OriginPrefix)
	if !found {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// Advance applies ev to run (mutating it) under def and returns the effects.
// It walks step to step until the run waits or ends, at most MaxAdvanceSteps
// steps per call (then it fails the run with a clear error). An inputMapping
// error fails the step with execution_failure and the fallback chain
// applies. Events for an ended run, and events whose token is not the one
// the run waits for, are stale: the run is left as it is and the effects are
// empty.
//
// ev is one of Started, TaskEnded, SignalArrived, TimerFired, ChildEnded or
// Cancel (or a pointer to one). Advance returns an error only for misuse (a
// nil definition or run, a definition of another workflow, an unknown event)
// and, as a last line of defence, for a panic inside it; the run must then
// be discarded.
func Advance(def *definition.Definition, run *Run, ev any, env Env) (eff Effects, err error) {
	if def == nil || run == nil {
		return Effects{}, fmt.Errorf("advance: definition and run are required")
	}
	if run.Workflow != "" && def.Name != "" && run.Workflow != def.Name {
		return Effects{}, fmt.Errorf("advance run %s: it belongs to workflow %q, not %q", run.ID, run.Workflow, def.Name)
	}
	defer func() {
		if r := recover(); r != nil {
			eff, err = Effects{}, fmt.Errorf("advance run %s: internal error: %v", run.ID, r)
		}
	}()
	return advance(def, run, ev, env)
}

// advance is Advance without the panic guard, so tests and the fuzz target
// see panics.
func advance(def *definition.Definition, run *Run, ev any, env Env) (Effects, error) {
	a := &advancer{def: def, run: run, env: env, prevWait: run.Wait, prevToken: run.Token, prevDeadline: run.Deadline}
	var applied bool
	switch e := ev.(type) {
	case Started:
		applied = a.started()
	case *Started:
		applied = e != nil && a.started()
	case TaskEnded:
		applied = a.taskEnded(e)
	case *TaskEnded:
		applied = e != nil && a.taskEnded(*e)
	case TaskWaiting:
		applied = a.taskWaiting(e)
	case *TaskWaiting:
		applied = e != nil && a.taskWaiting(*e)
	case SignalArrived:
		applied = a.signalArrived(e.Signal)
	case *SignalArrived:
		applied = e != nil && a.signalArrived(e.Signal)
	case TimerFired:
		applied = a.timerFired(e)
	case *TimerFired:
		applied = e != nil && a.timerFired(*e)
	case ChildEnded:
		applied = a.childEnded(e)
	case *ChildEnded:
		applied = e != nil && a.childEnded(*e)
	case Cancel:
		applied = a.cancel(e)
	case *Cancel:
		applied = e != nil && a.cancel(*e)
	default:
		return Effects{}, fmt.Errorf("advance run %s: unknown event %T", run.ID, ev)
	}
	if !applied {
		return Effects{}, nil
	}
	a.finish()
	return a.eff, nil
}

// advancer carries one Advance call.
type advancer struct {
	def *definition.Definition
	run *Run
	env Env
	eff Effects

	// prevWait, prevToken and prevDeadline are what the run waited for
	// before the call, to know whether it had a timer that must go.
	prevWait     WaitKind
	prevToken    string
	prevDeadline time.Time
	// entered counts the steps entered in this call (the guard).
	entered int
	// consumed are the signals of Env.Pending this call used up.
	consumed map[string]bool
	// outputsCopied says run.Outputs is this call's own map, so writing it
	// never changes a map the caller still holds from before the call.
	outputsCopied bool
	// last is the latest step result of the call, the reason a failed run
	// failed.
	last *stepEnd
}

// stepEnd is how a step visit ended.
type stepEnd struct {
	step    string
	outcome string
	output  json.RawMessage
	err     string
	// final says no retry may follow (NonRetryable errors, inputMapping
	// errors, polls used up).
	final bool
	// orFailure lets the outcome take the failure transition when it has
	// none of its own: polls running out and tasks that ran out of time are
	// a timeout, and a step without a timeout transition fails like any
	// failure.
	orFailure bool
	// timedOut says a task ran out of time: its timeout outcome is retried
	// like a failure, as it was before it had an outcome of its own.
	timedOut bool
	// code is the failed task's error code (TaskEnded.ErrorCode); err
	// already names it for people.
	code string
}

func (a *advancer) now() time.Time { return a.env.Now }

func (a *advancer) history(typ, detail string) {
	a.eff.History = append(a.eff.History, HistoryEvent{Type: typ, Step: a.run.Step, Detail: detail, Attempt: a.run.Attempt, At: a.now()})
}

// draw is the random draw for exponential_jitter; without a source the jitter
// is zero, which keeps the engine deterministic.
func (a *advancer) draw() float64 {
	if a.env.Rand == nil {
		return 0
	}
	return a.env.Rand()
}

func (a *advancer) finish() {
	a.run.UpdatedAt = a.now()
	hadTimer := a.prevWait == WaitRetry || a.prevWait == WaitPoll || a.prevWait == WaitPlan ||
		((a.prevWait == WaitSignal || a.prevWait == WaitTask) && !a.prevDeadline.IsZero())
	stillWaits := a.run.Wait == a.prevWait && a.run.Token == a.prevToken
	if hadTimer && !stillWaits && len(a.eff.Timers) == 0 {
		a.eff.ClearTimers = true
	}
}

// started starts a pending run at its start step.
func (a *advancer) started() bool {
	if a.run.Status != StatusPending && a.run.Status != "" {
		return false
	}
	if a.run.CreatedAt.IsZero() {
		a.run.CreatedAt = a.now()
	}
	a.run.Status = StatusRunning
	a.history(HistoryWorkflowStarted, string(a.run.Input))
	a.follow(StartStep)
	return true
}

// current returns the step the run is in; a run whose step is not in its
// definition fails (definitions are immutable, so this means corrupt state).
func (a *advancer) current() (*definition.Step, bool) {
	s, ok := a.def.Step(a.run.Step)
	if !ok || s == nil {
		a.failRun(fmt.Sprintf("the run is in step %q, which workflow %s version %s does not have", a.run.Step, a.def.Name, a.def.Version))
		return nil, false
	}
	return s, true
}

// waitsWith reports whether the run waits for one of kinds under token.
func (a *advancer) waitsWith(token string, kinds ...WaitKind) bool {
	if a.run.Status.Ended() || token == "" || token != a.run.Token {
		return false
	}
	for _, k := range kinds {
		if a.run.Wait == k {
			return true
		}
	}
	return false
}

// taskEnded handles the end of the task the run waits for. The runtime also
// reports a child that could not start this way (target_not_found), so it is
// accepted for child waits too.
func (a *advancer) taskEnded(e TaskEnded) bool {
	if !a.waitsWith(e.Token, WaitTask, WaitChild) {
		return false
	}
	waited := a.run.Wait
	a.clearWait()
	if waited == WaitTask {
		if step, plan, ok := a.planStep(); ok {
			a.follow(a.planAttemptEnded(step, plan, e.Token, e))
			return true
		}
	}
	step, ok := a.current()
	if !ok {
		return true
	}
	outcome, timedOut := e.outcome()
	errText := withCode(e.Error, e.ErrorCode)
	switch {
	case waited == WaitChild:
		a.history(HistoryChildCompleted, withError(outcome, errText))
	case outcome == definition.OutcomeTargetNotFound:
		a.history(HistoryActionNotFound, targetName(step))
	case outcome == definition.OutcomeTargetDisabled:
		a.history(HistoryActionDisabled, targetName(step))
	default:
		a.history(HistoryActionCompleted, withError(outcome, errText))
	}
	a.follow(a.stepOutcome(step, stepEnd{step: step.Name, outcome: outcome, output: e.Output, err: errText, final: e.NonRetryable,
		orFailure: timedOut, timedOut: timedOut, code: e.ErrorCode}))
	return true
}

// outcome is the step outcome of a task's end: no outcome is success, and a
// failure that ran out of time is timeout.
func (e TaskEnded) outcome() (outcome string, timedOut bool) {
	timedOut = e.TimedOut && e.Outcome == definition.OutcomeFailure
	switch {
	case e.Outcome == "":
		return definition.OutcomeSuccess, false
	case timedOut:
		return definition.OutcomeTimeout, true
	}
	return e.Outcome, false
}

// taskWaiting parks a run whose task's result comes later: it shows as
// waiting, and the task's end (TaskEnded) sets it running again.
func (a *advancer) taskWaiting(e TaskWaiting) bool {
	if !a.waitsWith(e.Token, WaitTask) || a.run.Status == StatusWaiting {
		return false
	}
	a.run.Status = StatusWaiting
	a.history(HistoryActionWaiting, "the result comes later, by completion token")
	return true
}

// childEnded handles the end of the child run the run waits for: a
// completed child is success, any other end failure.
func (a *advancer) childEnded(e ChildEnded) bool {
	if !a.waitsWith(e.Token, WaitChild) {
		return false
	}
	a.clearWait()
	step, ok := a.current()
	if !ok {
		return true
	}
	a.history(HistoryChildCompleted, string(e.Status))
	end := stepEnd{step: step.Name, outcome: definition.OutcomeSuccess, output: e.Output}
	if e.Status != StatusCompleted {
		end.outcome = definition.OutcomeFailure
		end.err = fmt.Sprintf("child workflow %s ended %s", targetName(step), statusOrUnknown(e.Status))
	}
	a.follow(a.stepOutcome(step, end))
	return true
}

// timerFired resumes a run after a retry delay, between polls or between
// plan attempts, or times out its signal wait or async plan attempt.
func (a *advancer) timerFired(e TimerFired) bool {
	if !a.waitsWith(e.Token, WaitRetry, WaitPoll, WaitSignal, WaitPlan, WaitTask) {
		return false
	}
	if (a.run.Wait == WaitSignal || a.run.Wait == WaitTask) && a.run.Deadline.IsZero() {
		// A wait without a timeout sets no timer; a timer for it is
		// not this run's.
		return false
	}
	waited := a.run.Wait
	a.clearWait()
	if waited == WaitPlan || waited == WaitTask {
		step, plan, ok := a.planStep()
		if !ok {
			a.failRun(fmt.Sprintf("step %q waited inside a plan but is not in a plan invocation", a.run.Step))
			return true
		}
		if waited == WaitTask {
			a.follow(a.planTimedOut(step, plan, e.Token))
		} else {
			a.follow(a.planContinue(step, plan))
		}
		return true
	}
	step, ok := a.current()
	if !ok {
		return true
	}
	if waited != WaitSignal {
		a.follow(a.execute(step))
		return true
	}
	if step.Wait == nil {
		a.failRun(fmt.Sprintf("step %q waited for a signal but is not a waitForSignal step", step.Name))
		return true
	}
	onTimeout := step.Wait.OnTimeout
	if onTimeout == "" {
		onTimeout = definition.TerminalTimedOut
	}
	a.history(HistorySignalTimeout, onTimeout)
	reason := fmt.Sprintf("no %q signal within %s", step.Wait.Type, step.Wait.Timeout)
	a.recordStep(stepEnd{step: step.Name, outcome: definition.OutcomeTimeout, err: reason})
	if step.Wait.OnTimeout != "" {
		a.follow(step.Wait.OnTimeout)
		return true
	}
	a.end(definition.Terminal{Name: definition.TerminalTimedOut, Status: definition.StatusTimedOut, BuiltIn: true}, reason)
	return true
}

// signalArrived records a signal and, when the run waits for its type,
// matches the oldest pending signal of that type and moves on. Matching goes
// through Env.Pending only: the store lists the new signal there, and a
// signal that is not there has been consumed already (a redelivery), so it
// cannot be matched twice. The store keeps unmatched signals for a later
// waitForSignal step.
func (a *advancer) signalArrived(sig Signal) bool {
	if a.run.Status.Ended() {
		return false
	}
	a.history(HistorySignalReceived, sig.Type)
	if a.run.Wait != WaitSignal || a.run.WaitingFor != sig.Type {
		return true
	}
	step, ok := a.current()
	if !ok {
		return true
	}
	matched, ok := a.takeSignal(sig.Type)
	if !ok {
		return true
	}
	a.clearWait()
	a.history(HistorySignalMatched, matched.Type)
	a.follow(a.stepOutcome(step, stepEnd{step: step.Name, outcome: definition.OutcomeSuccess, output: matched.Payload}))
	return true
}

// takeSignal consumes the oldest unconsumed signal of typ.
func (a *advancer) takeSignal(typ string) (Signal, bool) {
	for _, s := range a.env.Pending {
		if s.Type != typ || a.consumed[s.ID] {
			continue
		}
		if a.consumed == nil {
			a.consumed = map[string]bool{}
		}
		a.consumed[s.ID] = true
		a.eff.ConsumedSignals = append(a.eff.ConsumedSignals, s.ID)
		return s, true
	}
	return Signal{}, false
}

// cancel ends a run that has not ended as cancelled.
func (a *advancer) cancel(e Cancel) bool {
	if a.run.Status.Ended() {
		return false
	}
	a.clearWait()
	reason := e.Reason
	if reason == "" {
		reason = "cancelled"
	}
	a.endAs(definition.TerminalCancelled, StatusCancelled, HistoryWorkflowCancelled, reason, "")
	return true
}

// follow walks from target until the run waits or ends: each step either
// parks the run (and follow returns) or finishes at once and names the next
// target.
func (a *advancer) follow(target string) {
	for target != "" {
		if a.run.Status.Ended() {
			return
		}
		if term, ok := a.def.Terminal(target); ok {
			a.end(term, "")
			return
		}
		step, ok := a.def.Step(target)
		if !ok || step == nil {
			a.failRun(fmt.Sprintf("%q is neither a step nor a terminal of workflow %s version %s", target, a.def.Name, a.def.Version))
			return
		}
		if a.entered >= MaxAdvanceSteps {
			a.failRun(fmt.Sprintf("more than %d steps in one advance, the last %q: the workflow loops through steps that finish without waiting", MaxAdvanceSteps, step.Name))
			return
		}
		a.entered++
		target = a.visit(step)
	}
}

// visit begins a visit of step: attempts and polls start again.
func (a *advancer) visit(step *definition.Step) string {
	a.run.Step = step.Name
	a.run.Attempt = 1
	a.run.Polls = 0
	a.run.VisitStarted = a.now()
	a.run.Plan = nil
	a.clearWait()
	a.history(HistoryStepStarted, step.Name)
	if step.Wait != nil {
		return a.awaitSignal(step)
	}
	return a.execute(step)
}

// awaitSignal matches a signal that arrived earlier or parks the run.
func (a *advancer) awaitSignal(step *definition.Step) string {
	if sig, ok := a.takeSignal(step.Wait.Type); ok {
		a.history(HistorySignalMatched, sig.Type)
		return a.stepOutcome(step, stepEnd{step: step.Name, outcome: definition.OutcomeSuccess, output: sig.Payload})
	}
	token := a.nextToken()
	a.run.Wait = WaitSignal
	a.run.WaitingFor = step.Wait.Type
	a.run.Status = StatusWaiting
	if step.Wait.Timeout > 0 {
		a.run.Deadline = a.now().Add(step.Wait.Timeout)
		a.eff.Timers = append(a.eff.Timers, Timer{Token: token, At: a.run.Deadline, Kind: WaitSignal})
	}
	a.history(HistoryWaitingForSignal, step.Wait.Type)
	return ""
}

// execute runs one attempt (or poll) of a run step: it builds the input and
// invokes the action or starts the child, parking the run until it ends.
func (a *advancer) execute(step *definition.Step) string {
	if step.Run == nil {
		return a.stepOutcome(step, stepEnd{step: step.Name, outcome: definition.OutcomeExecutionFailure, err: "the step has no target", final: true})
	}
	input, err := a.input(step)
	if err != nil {
		// The input of a visit does not change between attempts, so
		// retrying cannot help.
		return a.stepOutcome(step, stepEnd{step: step.Name, outcome: definition.OutcomeExecutionFailure, err: err.Error(), final: true})
	}
	switch step.Run.Kind {
	case definition.TargetAction:
		a.invoke(step, step.Run.Name, input, step.Retry != nil)
		a.history(HistoryAwaitingAction, step.Run.Name)
	case definition.TargetWorkflow:
		token := a.nextToken()
		child := ChildStart{RunID: a.childID(step, token), Workflow: step.Run.Name, Version: step.Run.Version, Input: input, ParentToken: token}
		a.eff.Children = append(a.eff.Children, child)
		a.run.Wait = WaitChild
		a.run.Status = StatusRunning
		a.history(HistoryChildStarted, step.Run.String()+" as run "+child.RunID)
	case definition.TargetPlan:
		return a.executePlan(step, input)
	default:
		return a.stepOutcome(step, stepEnd{step: step.Name, outcome: definition.OutcomeExecutionFailure, err: fmt.Sprintf("run target %s is not supported", step.Run), final: true})
	}
	return ""
}

// invoke invokes one attempt of action as the run's next wait and returns
// its token. ownRetry says the workflow's retry block governs attempts, so
// the task gets one; otherwise the action's own policy applies.
func (a *advancer) invoke(step *definition.Step, action string, input json.RawMessage, ownRetry bool) string {
	token := a.nextToken()
	var maxAttempts int32
	if ownRetry {
		maxAttempts = 1
	}
	a.eff.Invokes = append(a.eff.Invokes, Invoke{
		TaskID:      TaskID(a.run.ID, step.Name, token),
		Action:      action,
		Payload:     input,
		Origin:      Origin(a.run.ID, token),
		MaxAttempts: maxAttempts,
	})
	a.run.Wait = WaitTask
	a.run.Status = StatusRunning
	return token
}

// childID names a child run: Env.NewID, or an id derived like a task id
// when the caller gives none.
func (a *advancer) childID(step *definition.Step, token string) string {
	if a.env.NewID != nil {
		if id := a.env.NewID(); id != "" {
			return id
		}
	}
	return TaskID(a.run.ID, step.Name, token+"/child")
}

// input is the step's input: its inputMapping resolved, or the run's input.
func (a *advancer) input(step *definition.Step) (json.RawMessage, error) {
	if step.InputMapping == nil {
		return a.run.Input, nil
	}
	return step.InputMapping.Resolve(a.mappingContext(step))
}

// mappingContext is what step's paths (its inputMapping, its plan's cache
// key) resolve against.
func (a *advancer) mappingContext(step *definition.Step) *mapping.Context {
	steps := make(map[string]mapping.StepResult, len(a.run.Outputs))
	for name, r := range a.run.Outputs {
		steps[name] = mapping.StepResult{Outcome: r.Outcome, Output: r.Output}
	}
	return &mapping.Context{Step: step.Name, RunID: a.run.ID, Now: a.now(), Input: a.run.Input, Steps: steps, MaxBytes: a.env.MaxPayloadBytes}
}

// stepOutcome decides what an outcome of the current visit leads to: another
// poll, a retry, or the step's transition. It returns the next target, or ""
// when the run now waits or has ended.
func (a *advancer) stepOutcome(step *definition.Step, end stepEnd) string {
	if end.outcome == definition.OutcomePending && step.Poll != nil {
		if a.run.Polls < step.Poll.MaxAttempts {
			a.run.Polls++
			delay := step.Poll.Delay(a.run.Polls, a.draw())
			token := a.nextToken()
			a.waitTimer(WaitPoll, token, delay)
			a.history(HistoryPollScheduled, fmt.Sprintf("poll %d of %d in %s", a.run.Polls, step.Poll.MaxAttempts, delay))
			return ""
		}
		end.outcome = definition.OutcomeTimeout
		end.err = fmt.Sprintf("still pending after %d polls", a.run.Polls)
		end.final = true
		end.orFailure = true
	}
	if next, retried := a.retry(step, end); retried {
		return next
	}
	return a.complete(step, end)
}

// retry schedules the next attempt of the step when its policy allows one.
func (a *advancer) retry(step *definition.Step, end stepEnd) (string, bool) {
	if step.Retry == nil || end.final || a.run.Attempt >= step.Retry.MaxAttempts {
		return "", false
	}
	if end.outcome != definition.OutcomeFailure && end.outcome != definition.OutcomeExecutionFailure && !end.timedOut {
		return "", false
	}
	delay, ok := step.Retry.Policy().NextWithDraw(a.run.Attempt, a.now().Sub(a.run.VisitStarted), a.draw())
	if !ok {
		return "", false
	}
	a.run.Attempt++
	a.run.Polls = 0
	a.history(HistoryStepRetry, withError(fmt.Sprintf("attempt %d of %d in %s after %s", a.run.Attempt, step.Retry.MaxAttempts, delay, end.outcome), end.err))
	if delay <= 0 {
		return a.execute(step), true
	}
	a.waitTimer(WaitRetry, a.nextToken(), delay)
	return "", true
}

// complete ends the visit of step with its outcome and returns the
// transition it takes; a missing transition fails the run.
func (a *advancer) complete(step *definition.Step, end stepEnd) string {
	a.recordStep(end)
	target, _, ok := step.Next(end.outcome)
	if !ok && end.orFailure {
		target, _, ok = step.Next(definition.OutcomeFailure)
	}
	if !ok {
		msg := fmt.Sprintf("step %q has no transition for outcome %q", step.Name, end.outcome)
		if end.err != "" {
			msg += " (" + end.err + ")"
		}
		a.failRun(msg)
		return ""
	}
	return target
}

// recordStep stores the visit's result and its history.
func (a *advancer) recordStep(end stepEnd) {
	if !a.outputsCopied {
		a.run.Outputs = maps.Clone(a.run.Outputs)
		if a.run.Outputs == nil {
			a.run.Outputs = map[string]StepResult{}
		}
		a.outputsCopied = true
	}
	a.run.Outputs[end.step] = StepResult{Outcome: end.outcome, Output: end.output, Attempts: a.run.Attempt, FinishedAt: a.now(), Error: end.err,
		ErrorCode: end.code}
	a.last = &end
	a.history(HistoryStepCompleted, withError(end.outcome, end.err))
}

// waitTimer parks the run until a timer fires after delay.
func (a *advancer) waitTimer(kind WaitKind, token string, delay time.Duration) {
	a.run.Wait = kind
	a.run.Status = StatusWaiting
	a.eff.Timers = append(a.eff.Timers, Timer{Token: token, At: a.now().Add(delay), Kind: kind})
}

// nextToken starts a new wait. Tokens count up across the run, so every
// invocation of the run has its own token, and so its own task id, even when
// a step is visited again.
func (a *advancer) nextToken() string {
	n, _ := strconv.ParseUint(a.run.Token, 10, 63)
	a.run.Token = strconv.FormatUint(n+1, 10)
	return a.run.Token
}

// clearWait leaves whatever the run waited for; the token stays, as the
// counter of the next one.
func (a *advancer) clearWait() {
	a.run.Wait = WaitNone
	a.run.WaitingFor = ""
	a.run.Deadline = time.Time{}
	if !a.run.Status.Ended() {
		a.run.Status = StatusRunning
	}
}

// end ends the run in a terminal. reason explains the end beyond the
// terminal's name.
func (a *advancer) end(term definition.Terminal, reason string) {
	status := Status(term.Status)
	var typ string
	switch status {
	case StatusCompleted:
		typ = HistoryWorkflowCompleted
	case StatusCancelled:
		typ = HistoryWorkflowCancelled
	case StatusTimedOut:
		typ = HistoryWorkflowTimedOut
	default:
		status, typ = StatusFailed, HistoryWorkflowFailed
	}
	detail := term.Name
	if reason != "" {
		detail += ": " + reason
	}
	var runErr string
	if status != StatusCompleted && status != StatusCancelled {
		runErr = reason
		if runErr == "" && a.last != nil {
			runErr = fmt.Sprintf("step %q ended with outcome %q", a.last.step, a.last.outcome)
			if a.last.err != "" {
				runErr = fmt.Sprintf("step %q ended with outcome %q: %s", a.last.step, a.last.outcome, a.last.err)
			}
		}
	}
	a.endAs(term.Name, status, typ, detail, runErr)
}

// failRun fails the run because it cannot go on; msg says why.
func (a *advancer) failRun(msg string) {
	a.endAs(definition.TerminalFailed, StatusFailed, HistoryWorkflowFailed, definition.TerminalFailed+": "+msg, msg)
}

func (a *advancer) endAs(terminal string, status Status, historyType, detail, runErr string) {
	a.clearWait()
	a.run.Plan = nil
	a.run.Status = status
	a.run.Terminal = terminal
	a.run.Error = runErr
	a.run.FinishedAt = a.now()
	a.eff.Ended = true
	a.history(historyType, detail)
}

func targetName(step *definition.Step) string {
	if step.Run == nil {
		return ""
	}
	if step.Run.Kind == definition.TargetAction {
		return step.Run.Name
	}
	return step.Run.String()
}

func withError(s, err string) string {
	if err == "" {
		return s
	}
	return s + ": " + err
}

// withCode adds a task's error code to its error, so that history and the
// run's error show it.
func withCode(err, code string) string {
	if code == "" {
		return err
	}
	return err + " (error code " + code + ")"
}

func statusOrUnknown(s Status) string {
	if s == "" {
		return "with no status"
	}
	return string(s)
}
