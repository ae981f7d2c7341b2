// Package backoff computes how long a failed task waits before its next attempt.
// The policy is copied onto every task when it is created, so a task keeps the
// retry behaviour it was invoked with even if its action is re-registered later.
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

// Policy is a retry delay policy.
type Policy struct {
	Kind       Kind
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64
}

// Default returns the policy used when an action sets none: exponential from
// 1 s doubling up to 5 min.
func Default() Policy {
	return Policy{Kind: DefaultKind, Initial: DefaultInitial, Max: DefaultMax, Multiplier: DefaultMultiplier}
}

// WithDefaults fills zero fields: kind exponential, max 5 min, multiplier 2.
// Initial stays as given because zero is a meaningful initial delay.
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

// FieldError says which policy field is invalid and why.
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
	return nil
}

func (p Policy) usesMultiplier() bool {
	return p.Kind == Exponential || p.Kind == ExponentialJitter || p.Kind == Capped
}

// Delay is the wait after the given attempt (1 for the first) failed, before
// the next one starts. Attempts below 1 count as 1.
func (p Policy) Delay(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	var d float64
	switch p.Kind {
	case Constant:
		d = float64(p.Initial)
	case Linear:
		d = float64(p.Initial) * float64(attempt)
	case ExponentialJitter:
		d = rand.Float64() * p.exponential(attempt)
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

func (p Policy) exponential(attempt int) float64 {
	return math.Min(float64(p.Initial)*math.Pow(p.Multiplier, float64(attempt-1)), float64(p.Max))
}
