package catalog

import (
	"time"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// Setting limits and defaults.
const (
	DefaultTimeout     = 5 * time.Minute
	MinTimeout         = 100 * time.Millisecond
	MaxTimeout         = 24 * time.Hour
	DefaultMaxAttempts = 3
	MaxMaxAttempts     = 1000
	// MaxBackoffDelay bounds backoff delays so millisecond values cannot overflow.
	MaxBackoffDelay = 7 * 24 * time.Hour
)

// Spec is requested action settings as the caller sent them: zero values
// mean defaults, and the units are the API's milliseconds.
type Spec struct {
	TimeoutMS   int64
	MaxAttempts int32
	// Backoff nil means the default policy.
	Backoff *BackoffSpec
}

// BackoffSpec is a requested retry policy; empty Kind and zero MaxMS or
// Multiplier take the defaults.
type BackoffSpec struct {
	Kind       string
	InitialMS  int64
	MaxMS      int64
	Multiplier float64
}

// DefaultSettings are the settings of an action registered without any.
func DefaultSettings() store.Settings {
	return store.Settings{Timeout: DefaultTimeout, MaxAttempts: DefaultMaxAttempts, Backoff: backoff.Default()}
}

// Settings applies defaults to s and validates the result.
func (s Spec) Settings() (store.Settings, error) {
	out := DefaultSettings()
	if s.TimeoutMS != 0 {
		if s.TimeoutMS < MinTimeout.Milliseconds() || s.TimeoutMS > MaxTimeout.Milliseconds() {
			return store.Settings{}, fault.Invalidf("timeout_ms must be between %d and %d, got %d", MinTimeout.Milliseconds(), MaxTimeout.Milliseconds(), s.TimeoutMS)
		}
		out.Timeout = time.Duration(s.TimeoutMS) * time.Millisecond
	}
	if s.MaxAttempts != 0 {
		if s.MaxAttempts < 1 || s.MaxAttempts > MaxMaxAttempts {
			return store.Settings{}, fault.Invalidf("max_attempts must be between 1 and %d, got %d", MaxMaxAttempts, s.MaxAttempts)
		}
		out.MaxAttempts = s.MaxAttempts
	}
	if s.Backoff != nil {
		p, err := s.Backoff.policy()
		if err != nil {
			return store.Settings{}, err
		}
		out.Backoff = p
	}
	return out, nil
}

func (b BackoffSpec) policy() (backoff.Policy, error) {
	limit := MaxBackoffDelay.Milliseconds()
	if b.InitialMS > limit {
		return backoff.Policy{}, fault.Invalidf("backoff.initial_delay_ms must be at most %d, got %d", limit, b.InitialMS)
	}
	if b.MaxMS > limit {
		return backoff.Policy{}, fault.Invalidf("backoff.max_delay_ms must be at most %d, got %d", limit, b.MaxMS)
	}
	p := backoff.Policy{
		Kind:       backoff.Kind(b.Kind),
		Initial:    time.Duration(b.InitialMS) * time.Millisecond,
		Max:        time.Duration(b.MaxMS) * time.Millisecond,
		Multiplier: b.Multiplier,
	}.WithDefaults()
	if err := p.Validate(); err != nil {
		return backoff.Policy{}, fault.Invalidf("backoff.%s", err.Error())
	}
	return p, nil
}

func validateNames(field string, names []string) error {
	for _, n := range names {
		if err := text.Name(field, n); err != nil {
			return err
		}
	}
	return nil
}

func notFoundNamespace(name string) error {
	return fault.NotFoundf("namespace %s not found", name)
}

func notFoundAction(namespace, name string) error {
	return fault.NotFoundf("action %s not found in namespace %s", name, namespace)
}
