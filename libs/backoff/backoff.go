// Package backoff computes how long something that failed waits before its
// next attempt: a task retried by the dispatcher, a workflow step retried or
// polled by the workflow engine. Both keep the policy next to the thing being
// retried (on the task row, in the workflow definition), so a retry keeps the
// behaviour it started with even if its action or workflow changes later.
package backoff

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Kind names a delay formula.
type Kind string

// The supported kinds. Capped is exponential growth that stays at MaxDelay
// once reached; every kind is capped at MaxDelay, so Capped and Exponential
// compute the same delays and Capped exists so policies can say so explicitly.
const (
	Constant          Kind = "constant"
	Linear            Kind = "linear"
	Exponential       Kind = "exponential"
	ExponentialJitter Kind = "exponential_jitter"
	Capped            Kind = "capped"
)

// Defaults used when a policy leaves a field at its zero value.
const (
	DefaultKind       = Exponential
	DefaultInitial    = time.Second
	DefaultMax        = 5 * time.Minute
	DefaultMultiplier = 2.0
)

// StepJitter is the jitter fraction of the workflow language: its
// exponential_jitter adds up to 25% to the exponential delay.
const StepJitter = 0.25

// Policy is a retry delay policy.
type Policy struct {
	Kind    Kind
	Initial time.Duration
	Max     time.Duration
	// Multiplier is the growth factor of the exponential kinds.
	Multiplier float64
	// JitterFraction shapes ExponentialJitter. Zero draws the delay uniformly
	// from [0, exponential] ("full jitter", what task retries use, since it
	// spreads a burst of failures best). A positive fraction f adds a random
	// extra of up to f times the exponential delay instead (StepJitter for
	// workflow steps). Either way the result is capped at Max.
	JitterFraction float64
	// Within is the total time budget for retries, measured from the start
	// of the first attempt; zero means no budget. See Next.
	Within time.Duration
}

// Default returns the policy used when an action sets none: exponential from
// 1 s doubling up to 5 min.
func Default() Policy {
	return Policy{Kind: DefaultKind, Initial: DefaultInitial, Max: DefaultMax, Multiplier: DefaultMultiplier}
}

// WithDefaults fills zero fields: kind exponential, max 5 min, multiplier 2.
// Initial stays as given because zero is a meaningful initial delay;
// JitterFraction and Within stay because zero means full jitter and no budget.
func (p Policy) WithDefaults() Policy {
	if p.Kind == "" {
		p.Kind = DefaultKind
	}
	if p.Max == 0 {
		p.Max = DefaultMax
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	return p
}

// FieldError says which policy field is invalid and why. Field uses the
// millisecond names of the APIs and the workflow language.
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return e.Field + " " + e.Problem }

// Validate reports the first invalid field of p.
func (p Policy) Validate() error {
	switch p.Kind {
	case Constant, Linear, Exponential, ExponentialJitter, Capped:
	default:
		return &FieldError{Field: "kind", Problem: fmt.Sprintf("%q is not one of constant, linear, exponential, exponential_jitter, capped", string(p.Kind))}
	}
	if p.Initial < 0 {
		return &FieldError{Field: "initial_delay_ms", Problem: "must not be negative"}
	}
	if p.Max < p.Initial {
		return &FieldError{Field: "max_delay_ms", Problem: "must not be less than initial_delay_ms"}
	}
	if p.usesMultiplier() && (p.Multiplier < 1 || math.IsNaN(p.Multiplier) || math.IsInf(p.Multiplier, 0)) {
		return &FieldError{Field: "multiplier", Problem: "must be a finite number of at least 1"}
	}
	if p.JitterFraction < 0 || p.JitterFraction > 1 || math.IsNaN(p.JitterFraction) {
		return &FieldError{Field: "jitter", Problem: "must be between 0 and 1"}
	}
	if p.Within < 0 {
		return &FieldError{Field: "within_ms", Problem: "must not be negative"}
	}
	return nil
}

func (p Policy) usesMultiplier() bool {
	return p.Kind == Exponential || p.Kind == ExponentialJitter || p.Kind == Capped
}

// Delay is the wait after the given attempt (1 for the first) failed, before
// the next one starts. Attempts below 1 count as 1. In the workflow
// reference's words, with retry n = attempt-1 counted from zero: constant is
// initial, linear initial×(n+1), exponential initial×multiplier^n, all capped
// at Max. ExponentialJitter draws its randomness from math/rand/v2.
func (p Policy) Delay(attempt int) time.Duration {
	return p.DelayWithDraw(attempt, rand.Float64())
}

// DelayWithDraw is Delay with the random draw given, a number in [0, 1) that
// only ExponentialJitter uses: callers that must compute the same delay again
// (an engine replaying a decision) keep their draw.
func (p Policy) DelayWithDraw(attempt int, draw float64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	draw = min(max(draw, 0), 1)
	var d float64
	switch p.Kind {
	case Constant:
		d = float64(p.Initial)
	case Linear:
		d = float64(p.Initial) * float64(attempt)
	case ExponentialJitter:
		exp := p.exponential(attempt)
		if p.JitterFraction > 0 {
			d = exp + draw*p.JitterFraction*exp
		} else {
			d = draw * exp
		}
	default:
		d = p.exponential(attempt)
	}
	if d >= float64(p.Max) || math.IsNaN(d) {
		return p.Max
	}
	if d < 0 {
		return 0
	}
	return time.Duration(d)
}

// Next decides whether another attempt may follow the given failed attempt
// (1 for the first) when elapsed time has passed since the first attempt
// started, and returns the delay before it. With a Within budget, a retry
// that would start after the budget ends is refused. Attempt limits are the
// caller's: they differ between tasks and steps and live beside the policy.
func (p Policy) Next(attempt int, elapsed time.Duration) (time.Duration, bool) {
	return p.NextWithDraw(attempt, elapsed, rand.Float64())
}

// NextWithDraw is Next with the random draw given, as in DelayWithDraw.
func (p Policy) NextWithDraw(attempt int, elapsed time.Duration, draw float64) (time.Duration, bool) {
	d := p.DelayWithDraw(attempt, draw)
	if p.Within > 0 && elapsed+d > p.Within {
		return 0, false
	}
	return d, true
}

func (p Policy) exponential(attempt int) float64 {
	return math.Min(float64(p.Initial)*math.Pow(p.Multiplier, float64(attempt-1)), float64(p.Max))
}
