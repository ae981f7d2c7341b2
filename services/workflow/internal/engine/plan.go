package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/razorbill/flo/services/workflow/internal/definition"
)

// A plan step runs one invocation of an inline plan: it asks the cache, then
// walks the executors in the order the selection gave, each with its own
// retries, until one succeeds. Every decision the PlanGate makes (the order,
// an admission, a cache hit) is taken once and kept in Run.Plan, so a redo
// after a crash or a late event never decides differently.

// planRef names the plan for the gate.
func (a *advancer) planRef(plan *definition.Plan) PlanRef {
	return PlanRef{Namespace: a.run.Namespace, Workflow: a.run.Workflow, Plan: plan.Name}
}

// executePlan begins an invocation of the step's plan.
func (a *advancer) executePlan(step *definition.Step, input json.RawMessage) string {
	plan, ok := a.def.Plan(step.Run.Name)
	if !ok {
		return a.stepOutcome(step, stepEnd{step: step.Name, outcome: definition.OutcomeExecutionFailure,
			err: fmt.Sprintf("workflow %s version %s has no plan %q", a.def.Name, a.def.Version, step.Run.Name), final: true})
	}
	ref := a.planRef(plan)
	order := plan.ByPriority()
	if a.env.Plans != nil {
		order = a.env.Plans.Order(ref, plan)
	}
	a.run.Plan = &PlanProgress{Order: order}
	if plan.Cache != nil {
		key, ok := plan.Cache.Key.Render(a.mappingContext(step))
		switch {
		case !ok:
			a.history(HistoryPlanCacheSkipped, fmt.Sprintf("cache key %s selects nothing for this run: the cache is not used", plan.Cache.Key))
		case len(key) > definition.MaxCacheKeyBytes:
			a.history(HistoryPlanCacheSkipped, fmt.Sprintf("cache key %s renders to %d bytes, over the limit of %d: the cache is not used", plan.Cache.Key, len(key), definition.MaxCacheKeyBytes))
		default:
			if out, hit := a.cached(ref, key); hit {
				a.history(HistoryPlanCacheHit, key)
				a.planEvent(plan, "", PlanCacheHit)
				a.run.Plan = nil
				return a.stepOutcome(step, stepEnd{step: step.Name, outcome: definition.OutcomeSuccess, output: out, final: true})
			}
			a.run.Plan.CacheKey = key
			a.history(HistoryPlanCacheMiss, key)
			a.planEvent(plan, "", PlanCacheMiss)
		}
	}
	return a.planWalk(step, plan, input)
}

func (a *advancer) cached(ref PlanRef, key string) (json.RawMessage, bool) {
	if a.env.Plans == nil {
		return nil, false
	}
	return a.env.Plans.Cached(ref, key, a.now())
}

// planContinue goes on with the plan after a wait or a failed attempt; the
// step's input is built again, from the same run state.
func (a *advancer) planContinue(step *definition.Step, plan *definition.Plan) string {
	input, err := a.input(step)
	if err != nil {
		a.run.Plan = nil
		return a.stepOutcome(step, stepEnd{step: step.Name, outcome: definition.OutcomeExecutionFailure, err: err.Error(), final: true})
	}
	return a.planWalk(step, plan, input)
}

// planWalk starts the next attempt: on the current executor, or on the next
// one in the order that is admitted. Executors whose breaker is open are
// passed over for this invocation; executors over their rate limit are
// passed over too, and when no executor succeeds the walk waits until the
// first of them has room and tries them again.
func (a *advancer) planWalk(step *definition.Step, plan *definition.Plan, input json.RawMessage) string {
	pp := a.run.Plan
	ref := a.planRef(plan)
	for pp.Index < len(pp.Order) {
		ex, ok := plan.Executor(pp.Order[pp.Index])
		if !ok {
			pp.Index, pp.Attempt = pp.Index+1, 0
			continue
		}
		var adm Admission
		if a.env.Plans != nil {
			adm = a.env.Plans.Admit(ref, plan, ex, a.now())
		}
		switch adm.Skip {
		case SkipNone:
			return a.planInvoke(step, plan, ex, input)
		case SkipRateLimited:
			a.history(HistoryPlanRateLimited, withError(ex.Name, adm.Detail))
			a.planEventSkip(plan, ex.Name, adm.Skip)
			if pp.Attempt > 0 {
				// A retry waits for room on its own executor: the
				// retry policy chose it.
				a.planWait(adm.RetryAt)
				return ""
			}
			pp.RateSkipped = append(pp.RateSkipped, ex.Name)
			if pp.RetryAt.IsZero() || adm.RetryAt.Before(pp.RetryAt) {
				pp.RetryAt = adm.RetryAt
			}
		default:
			a.history(HistoryPlanBreakerSkip, withError(ex.Name, adm.Detail))
			a.planEventSkip(plan, ex.Name, adm.Skip)
		}
		pp.Index, pp.Attempt = pp.Index+1, 0
	}
	if len(pp.RateSkipped) > 0 {
		at := pp.RetryAt
		a.history(HistoryPlanRateWait, fmt.Sprintf("%s rate limited; trying again at %s", strings.Join(pp.RateSkipped, ", "), at.UTC().Format(time.RFC3339Nano)))
		pp.Order, pp.Index, pp.Attempt = pp.RateSkipped, 0, 0
		pp.RateSkipped, pp.RetryAt = nil, time.Time{}
		a.planWait(at)
		return ""
	}
	return a.planExhausted(step, plan)
}

// planWait parks the plan until at (an executor's retry delay, or room under
// a rate limit); a time that has passed waits a moment, so a gate that
// cannot say when there is room does not spin the run.
func (a *advancer) planWait(at time.Time) {
	delay := at.Sub(a.now())
	if delay <= 0 {
		delay = 100 * time.Millisecond
	}
	a.waitTimer(WaitPlan, a.nextToken(), delay)
}

// planInvoke invokes one attempt of ex. An async executor's run shows as
// waiting at once, with a timer for the attempt's timeout_ms.
func (a *advancer) planInvoke(step *definition.Step, plan *definition.Plan, ex *definition.Executor, input json.RawMessage) string {
	pp := a.run.Plan
	if pp.Attempt == 0 {
		pp.Attempt, pp.Started = 1, a.now()
		pp.Tried++
	}
	token := a.invoke(step, ex.Action, input, ex.Retry != nil)
	if ex.Tracking.Async {
		timeout := ex.Tracking.Timeout
		if timeout <= 0 {
			timeout = definition.DefaultAsyncTimeout
		}
		a.run.Status = StatusWaiting
		a.run.Deadline = a.now().Add(timeout)
		a.eff.Timers = append(a.eff.Timers, Timer{Token: token, At: a.run.Deadline, Kind: WaitTask})
	}
	a.history(HistoryPlanExecutorStart, fmt.Sprintf("%s attempt %d (@actions/%s)", ex.Name, pp.Attempt, ex.Action))
	a.eff.PlanEvents = append(a.eff.PlanEvents, PlanEvent{Ref: a.planRef(plan), Plan: plan, Executor: ex.Name, Kind: PlanAttemptStarted, RunID: a.run.ID, Token: token})
	return ""
}

// planAttemptEnded handles the end of the current executor's attempt.
func (a *advancer) planAttemptEnded(step *definition.Step, plan *definition.Plan, token string, e TaskEnded) string {
	pp := a.run.Plan
	name := pp.Order[pp.Index]
	ex, _ := plan.Executor(name)
	outcome, timedOut := e.outcome()
	ended := PlanEvent{Ref: a.planRef(plan), Plan: plan, Executor: name, Kind: PlanAttemptEnded, RunID: a.run.ID, Token: token, Outcome: outcome}
	if !planFailed(outcome) {
		a.eff.PlanEvents = append(a.eff.PlanEvents, ended)
		a.history(HistoryPlanExecutorSuccess, name+": "+outcome)
		if outcome == definition.OutcomeSuccess && pp.CacheKey != "" {
			a.eff.CacheWrites = append(a.eff.CacheWrites, CacheWrite{
				Ref: a.planRef(plan), Key: pp.CacheKey, Output: e.Output,
				Expires: a.now().Add(plan.Cache.TTL), InvalidateOn: plan.Cache.InvalidateOn,
			})
		}
		a.run.Plan = nil
		return a.stepOutcome(step, stepEnd{step: step.Name, outcome: outcome, output: e.Output})
	}
	fatal := outcome == definition.OutcomeFailure && plan.Errors.IsFatal(e.ErrorCode)
	ended.APIFailed, ended.BusinessFailed = !fatal, fatal
	a.eff.PlanEvents = append(a.eff.PlanEvents, ended)
	errText := withCode(e.Error, e.ErrorCode)
	pp.Last = &PlanFailure{Executor: name, Outcome: outcome, Error: errText, Code: e.ErrorCode, TimedOut: timedOut}
	// A coded failure is classified by the plan's errors block alone: a
	// non-fatal code is retried even when the task itself is final (a
	// failure reported by completion token always is). An uncoded failure
	// the worker marked non-retryable is not.
	final := fatal || (e.NonRetryable && e.ErrorCode == "")
	if ex != nil && !final && ex.Retry != nil && pp.Attempt < ex.Retry.MaxAttempts && retriable(outcome) {
		if delay, ok := ex.Retry.Policy().NextWithDraw(pp.Attempt, a.now().Sub(pp.Started), a.draw()); ok {
			pp.Attempt++
			a.history(HistoryPlanExecutorRetry, withError(fmt.Sprintf("%s attempt %d of %d in %s after %s", name, pp.Attempt, ex.Retry.MaxAttempts, delay, outcome), errText))
			if delay <= 0 {
				return a.planContinue(step, plan)
			}
			a.planWait(a.now().Add(delay))
			return ""
		}
	}
	why := outcome
	if fatal {
		why += " with fatal error code " + e.ErrorCode
	}
	a.history(HistoryPlanExecutorExhausted, withError(fmt.Sprintf("%s: %s after %d attempt(s)", name, why, pp.Attempt), errText))
	if plan.Fallback != nil && plan.Fallback.Condition == definition.FallbackAnyError {
		return a.planFallback(step, plan, "executor "+name+" failed")
	}
	pp.Index, pp.Attempt = pp.Index+1, 0
	return a.planContinue(step, plan)
}

// planFailed reports whether an executor's outcome fails its attempt; any
// other outcome (success, pending, a named one) ends the plan with it.
func planFailed(outcome string) bool {
	return outcome == definition.OutcomeFailure || outcome == definition.OutcomeTimeout || definition.IsExecutionOutcome(outcome)
}

// retriable reports whether an executor's retry block retries an outcome;
// a missing or disabled action is not retried.
func retriable(outcome string) bool {
	return outcome == definition.OutcomeFailure || outcome == definition.OutcomeTimeout || outcome == definition.OutcomeExecutionFailure
}

// planExhausted ends an invocation in which no executor succeeded: the
// fallback value when the plan has one, otherwise the last executor's
// failure.
func (a *advancer) planExhausted(step *definition.Step, plan *definition.Plan) string {
	if plan.Fallback != nil {
		return a.planFallback(step, plan, "every executor failed or was skipped")
	}
	pp := a.run.Plan
	a.run.Plan = nil
	end := stepEnd{step: step.Name, outcome: definition.OutcomeFailure,
		err: fmt.Sprintf("plan %s: no executor could be tried (every one was skipped)", plan.Name)}
	if last := pp.Last; last != nil {
		end.outcome, end.code, end.timedOut, end.orFailure = last.Outcome, last.Code, last.TimedOut, last.TimedOut
		end.err = withError(fmt.Sprintf("plan %s: every executor failed; the last, %s, with %s", plan.Name, last.Executor, last.Outcome), last.Error)
	}
	return a.stepOutcome(step, end)
}

// planFallback ends the invocation with the plan's fallback value, as a
// success.
func (a *advancer) planFallback(step *definition.Step, plan *definition.Plan, why string) string {
	a.history(HistoryPlanFallback, why+": the plan returns its fallback value")
	a.planEvent(plan, "", PlanFallbackUsed)
	a.run.Plan = nil
	return a.stepOutcome(step, stepEnd{step: step.Name, outcome: definition.OutcomeSuccess, output: plan.Fallback.Value, final: true})
}

// planTimedOut ends an async attempt that got no outcome within its
// timeout_ms.
func (a *advancer) planTimedOut(step *definition.Step, plan *definition.Plan, token string) string {
	pp := a.run.Plan
	timeout := definition.DefaultAsyncTimeout
	if ex, ok := plan.Executor(pp.Order[pp.Index]); ok && ex.Tracking.Timeout > 0 {
		timeout = ex.Tracking.Timeout
	}
	return a.planAttemptEnded(step, plan, token, TaskEnded{
		Token: token, Outcome: definition.OutcomeFailure, TimedOut: true,
		Error: fmt.Sprintf("no outcome within timeout_ms %d (async tracking)", timeout.Milliseconds()),
	})
}

// planStep returns the plan of the current step when the run is inside a
// plan invocation.
func (a *advancer) planStep() (*definition.Step, *definition.Plan, bool) {
	pp := a.run.Plan
	if pp == nil || pp.Index >= len(pp.Order) {
		return nil, nil, false
	}
	step, ok := a.current()
	if !ok || step.Run == nil || step.Run.Kind != definition.TargetPlan {
		return nil, nil, false
	}
	plan, ok := a.def.Plan(step.Run.Name)
	if !ok {
		return nil, nil, false
	}
	return step, plan, true
}

func (a *advancer) planEvent(plan *definition.Plan, executor string, kind PlanEventKind) {
	a.eff.PlanEvents = append(a.eff.PlanEvents, PlanEvent{Ref: a.planRef(plan), Plan: plan, Executor: executor, Kind: kind, RunID: a.run.ID})
}

func (a *advancer) planEventSkip(plan *definition.Plan, executor string, reason SkipReason) {
	a.eff.PlanEvents = append(a.eff.PlanEvents, PlanEvent{Ref: a.planRef(plan), Plan: plan, Executor: executor, Kind: PlanSkipped, RunID: a.run.ID, Skip: reason})
}
