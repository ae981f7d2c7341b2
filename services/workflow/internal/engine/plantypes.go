package engine

import (
	"encoding/json"
	"time"

	"github.com/razorbill/flo/services/workflow/internal/definition"
)

// WaitPlan is a plan step waiting between executor attempts: an executor's
// retry delay, or room under the rate limits.
const WaitPlan WaitKind = "plan"

// The history events of plan steps. Each names its executor first in Detail.
const (
	HistoryPlanExecutorStart     = "plan_executor_start"
	HistoryPlanExecutorSuccess   = "plan_executor_success"
	HistoryPlanExecutorRetry     = "plan_executor_retry"
	HistoryPlanExecutorExhausted = "plan_executor_exhausted"
	HistoryPlanBreakerSkip       = "plan_breaker_skip"
	HistoryPlanRateLimited       = "plan_rate_limited"
	HistoryPlanRateWait          = "plan_rate_wait"
	HistoryPlanCacheHit          = "plan_cache_hit"
	HistoryPlanCacheMiss         = "plan_cache_miss"
	HistoryPlanCacheSkipped      = "plan_cache_skipped"
	HistoryPlanFallback          = "plan_fallback"
)

// PlanRef names one plan of one workflow in a namespace.
type PlanRef struct {
	Namespace, Workflow, Plan string
}

// PlanGate is what a plan step asks the world outside the run: the order to
// try executors in, whether an executor may take an attempt now, and what the
// cache holds. Its answers depend on shared state (health, breakers, cluster
// rate limits, the cache), so the engine records every answer in the run and
// never asks again for a decision it has made.
type PlanGate interface {
	// Order returns the names of the plan's executors in the order this
	// invocation tries them.
	Order(ref PlanRef, plan *definition.Plan) []string
	// Admit decides whether an attempt on ex may start at now. An admitted
	// attempt counts against the executor's rate limits.
	Admit(ref PlanRef, plan *definition.Plan, ex *definition.Executor, now time.Time) Admission
	// Cached returns the output stored under key, if an entry is live at
	// now.
	Cached(ref PlanRef, key string, now time.Time) (json.RawMessage, bool)
}

// Admission is a PlanGate's answer to an attempt.
type Admission struct {
	// Skip is why the attempt may not start; empty admits it.
	Skip SkipReason
	// Detail says more for history: which limit, what state.
	Detail string
	// RetryAt is when a rate-limited executor has room again.
	RetryAt time.Time
}

// SkipReason says why an executor is passed over.
type SkipReason string

// The reasons an executor is passed over.
const (
	SkipNone SkipReason = ""
	// SkipBreakerOpen: the breaker is open, or half-open with every probe
	// taken.
	SkipBreakerOpen SkipReason = "breaker_open"
	// SkipRateLimited: one of the executor's rate limits is used up.
	SkipRateLimited SkipReason = "rate_limited"
)

// PlanProgress is where a plan step visit stands; it is part of the run's
// durable state, so a restart resumes it where it was.
type PlanProgress struct {
	// Order is the executor order the selection gave at the visit's start.
	Order []string
	// Index is the current executor's position in Order.
	Index int
	// Attempt is the attempt on the current executor, 1-based; 0 before
	// its first.
	Attempt int
	// Started is when the current executor's first attempt began; its
	// within_ms budget counts from it.
	Started time.Time
	// RateSkipped lists the executors passed over for their rate limits in
	// this walk; when no executor succeeds, the walk starts again with them
	// once one has room.
	RateSkipped []string `json:",omitempty"`
	// RetryAt is the earliest time a rate-skipped executor has room.
	RetryAt time.Time
	// Tried counts executors that took at least one attempt.
	Tried int
	// CacheKey is the visit's rendered cache key, empty when the plan has
	// no cache or the key could not be built.
	CacheKey string `json:",omitempty"`
	// Last is how the most recent executor failed: the plan's outcome when
	// every executor failed.
	Last *PlanFailure `json:",omitempty"`
}

// PlanFailure is how an executor's last attempt failed.
type PlanFailure struct {
	Executor, Outcome, Error, Code string
	TimedOut                       bool
}

// PlanEvent is something that happened to an executor, for the replica's
// health scores, breakers and metrics; the runtime applies it after the
// transaction that recorded it commits.
type PlanEvent struct {
	Ref      PlanRef
	Plan     *definition.Plan
	Executor string
	Kind     PlanEventKind
	// RunID and Token identify an attempt (started, ended).
	RunID, Token string
	// Outcome is an ended attempt's outcome.
	Outcome string
	// APIFailed says the executor did not do the work: it failed with no
	// code or a code that is not fatal, ran out of time, or was not found
	// or disabled. BusinessFailed says it did the work and refused it: it
	// failed with a fatal code. A success, pending or named outcome is
	// neither.
	APIFailed, BusinessFailed bool
	// Skip is a skipped executor's reason.
	Skip SkipReason
}

// PlanEventKind says what a PlanEvent reports.
type PlanEventKind string

// The kinds of plan events.
const (
	PlanAttemptStarted PlanEventKind = "started"
	PlanAttemptEnded   PlanEventKind = "ended"
	PlanSkipped        PlanEventKind = "skipped"
	PlanCacheHit       PlanEventKind = "cache_hit"
	PlanCacheMiss      PlanEventKind = "cache_miss"
	PlanFallbackUsed   PlanEventKind = "fallback"
)

// CacheWrite stores a plan's successful output under its key until Expires.
type CacheWrite struct {
	Ref          PlanRef
	Key          string
	Output       json.RawMessage
	Expires      time.Time
	InvalidateOn []string
}
