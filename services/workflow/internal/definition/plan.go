package definition

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

// Selection is how a plan orders its executors for one invocation.
type Selection string

// The selection strategies.
const (
	// SelectStaticOrder tries executors by priority, highest first.
	SelectStaticOrder Selection = "static-order"
	// SelectRoundRobin rotates the first executor across invocations.
	SelectRoundRobin Selection = "round-robin"
	// SelectRandom shuffles the executors for every invocation.
	SelectRandom Selection = "random"
	// SelectHealthWeighted tries executors by health score, highest
	// first; it needs a health block.
	SelectHealthWeighted Selection = "health-weighted"
)

// FallbackCondition says when a plan returns its fallback value.
type FallbackCondition string

// The fallback conditions.
const (
	// FallbackExhausted returns the value when every executor failed.
	FallbackExhausted FallbackCondition = "exhausted"
	// FallbackAnyError returns the value at the first executor that
	// fails (its retries spent or a fatal code), trying no other.
	FallbackAnyError FallbackCondition = "any_error"
)

// Defaults of plan blocks, for fields they leave out.
const (
	DefaultSelection        = SelectStaticOrder
	DefaultFailureThreshold = 5
	DefaultCooldown         = 30 * time.Second
	DefaultHalfOpenMaxCalls = 1
	DefaultAsyncTimeout     = 5 * time.Minute
	DefaultHealthWindow     = 5 * time.Minute
	DefaultHealthDecay      = 0.9
	DefaultHealthMinSamples = 10
	DefaultFallback         = FallbackExhausted
)

// Plan is an inline plan: several executors for one logical step, tried in
// the order the selection gives until one succeeds.
type Plan struct {
	Name      string
	Pos       Position
	Selection Selection
	// Executors are as written; Priority orders them for static-order.
	Executors []*Executor
	// Health is required by health-weighted and ignored otherwise.
	Health *Health
	// Cache is nil when outcomes are not cached.
	Cache *Cache
	// Fallback is nil when a plan whose executors all failed fails.
	Fallback *Fallback
	Errors   ErrorClasses
}

// Executor returns the executor called name.
func (p *Plan) Executor(name string) (*Executor, bool) {
	for _, e := range p.Executors {
		if e.Name == name {
			return e, true
		}
	}
	return nil, false
}

// ByPriority returns the executors' names by priority, highest first, ties
// as written: the static-order selection, and the order every other
// selection starts from.
func (p *Plan) ByPriority() []string {
	sorted := slices.Clone(p.Executors)
	slices.SortStableFunc(sorted, func(a, b *Executor) int { return cmp.Compare(b.Priority, a.Priority) })
	names := make([]string, len(sorted))
	for i, e := range sorted {
		names[i] = e.Name
	}
	return names
}

// Executor is one way a plan can do its work: an action with its own retry
// policy, circuit breaker, rate limit and tracking mode.
type Executor struct {
	Name string
	Pos  Position
	// Action is the action's name (the NAME of @actions/NAME).
	Action   string
	Priority int
	// Retry is nil when the action's own policy governs its attempts.
	Retry *Retry
	// Breaker is nil when the executor has no circuit breaker.
	Breaker *Breaker
	// RateLimit is nil when the executor is not rate limited.
	RateLimit *RateLimit
	Tracking  Tracking
}

// Breaker is an executor's circuit breaker.
type Breaker struct {
	// FailureThreshold consecutive failures open the breaker.
	FailureThreshold int
	// Cooldown is how long it stays open before it lets probes through.
	Cooldown time.Duration
	// HalfOpenMaxCalls is how many probes the half-open breaker allows;
	// that many successes close it, one failure opens it again.
	HalfOpenMaxCalls int
}

// RateLimit bounds how often an executor is called, for the whole cluster.
// Zero fields are no limit.
type RateLimit struct {
	PerSecond, PerMinute, PerHour int
}

// Tracking says how an executor's outcome arrives.
type Tracking struct {
	// Async says the action only accepts the work; its outcome comes later
	// by completion token, and the run waits for it in waiting.
	Async bool
	// Timeout bounds an async attempt: no outcome by then is a timeout.
	Timeout time.Duration
}

// Health configures the scores health-weighted selection orders by.
type Health struct {
	// Window is how far back samples count.
	Window time.Duration
	// Decay in (0, 1] weighs each older sample by one more factor.
	Decay float64
	// MinSamples is how many samples an executor needs in the window before
	// its score counts; until then it scores as healthy.
	MinSamples int
}

// Cache stores a plan's successful outcomes under a key built from the run.
type Cache struct {
	TTL time.Duration
	Key *CacheKey
	// InvalidateOn names the events that remove entries.
	InvalidateOn []string

	keyPos Position
}

// MaxCacheKeyBytes bounds a rendered cache key: a longer one (a key field
// holding a document) skips the cache for that run rather than storing an
// index entry Postgres would refuse.
const MaxCacheKeyBytes = 512

// CacheKey is a compiled cache key template: literal text with {PATH}
// placeholders, each a path of the language without its "$." prefix
// ({input.customer_id}, {steps.NAME.output.id}, {flo.run_id}).
type CacheKey struct {
	src   string
	parts []keyPart
}

// keyPart is literal text, or a placeholder compiled as a one-path
// template, which resolves it exactly as an inputMapping would.
type keyPart struct {
	text string
	path *mapping.Template
}

// String returns the template as written.
func (k *CacheKey) String() string { return k.src }

// CompileCacheKey compiles a cache key template. A placeholder's path must
// be singular: a key names one entry.
func CompileCacheKey(src string) (*CacheKey, error) {
	k := &CacheKey{src: src}
	rest := src
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			k.parts = append(k.parts, keyPart{text: rest})
			break
		}
		if closing := strings.IndexByte(rest[:open], '}'); closing >= 0 {
			return nil, fmt.Errorf("cache key %q has a '}' with no '{' before it", src)
		}
		if open > 0 {
			k.parts = append(k.parts, keyPart{text: rest[:open]})
		}
		rest = rest[open+1:]
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return nil, fmt.Errorf("cache key %q has a '{' that is never closed", src)
		}
		raw := rest[:end]
		rest = rest[end+1:]
		p, err := mapping.ParsePath("$." + raw)
		if err != nil {
			return nil, fmt.Errorf("cache key %q: placeholder {%s}: %w", src, raw, err)
		}
		if !p.Singular() {
			return nil, fmt.Errorf("cache key %q: placeholder {%s} can select several values; a key needs one", src, raw)
		}
		quoted, _ := json.Marshal("$." + raw)
		t, err := mapping.Compile(string(quoted))
		if err != nil {
			return nil, fmt.Errorf("cache key %q: placeholder {%s}: %w", src, raw, err)
		}
		k.parts = append(k.parts, keyPart{path: t})
	}
	return k, nil
}

// Render builds the key for one run. A string value goes in as it is, any
// other value as its JSON text. ok is false when a placeholder selects
// nothing (or null): such a run is neither served from nor stored in the
// cache, so runs that lack a key field can never share an entry.
func (k *CacheKey) Render(c *mapping.Context) (key string, ok bool) {
	var b strings.Builder
	for _, part := range k.parts {
		if part.path == nil {
			b.WriteString(part.text)
			continue
		}
		v, err := part.path.Resolve(c)
		if err != nil || len(v) == 0 || string(v) == "null" {
			return "", false
		}
		var s string
		if json.Unmarshal(v, &s) == nil {
			b.WriteString(s)
			continue
		}
		b.Write(v)
	}
	return b.String(), true
}

// Fallback is the value a plan returns instead of failing.
type Fallback struct {
	Value     json.RawMessage
	Condition FallbackCondition
}

// ErrorClasses classify the error codes workers fail with.
type ErrorClasses struct {
	// Retryable codes go through the executor's retry policy, as unlisted
	// codes do.
	Retryable []string
	// Fatal codes skip the executor's remaining retries.
	Fatal []string
}

// IsFatal reports whether code is one of the fatal codes.
func (c ErrorClasses) IsFatal(code string) bool {
	if code == "" {
		return false
	}
	for _, f := range c.Fatal {
		if f == code {
			return true
		}
	}
	return false
}
