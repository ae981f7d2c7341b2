package definition

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

// Limits on plans.
const (
	MaxPlans     = 100
	MaxExecutors = 32
	// MaxPlanListEntries bounds an invalidate_on list and each error code
	// list: cache entries store their invalidate_on list.
	MaxPlanListEntries = 100
	// MaxBreakerCount bounds failure_threshold and half_open_max_calls.
	MaxBreakerCount  = 10000
	MaxRateLimit     = 1_000_000_000
	MaxHealthSamples = 10000
	// MaxPlanTimeout bounds tracking timeout_ms and cache ttl_ms.
	MaxPlanTimeout = 365 * 24 * time.Hour
)

var (
	planFields      = []string{"selection", "executors", "health", "cache", "fallback", "errors"}
	executorFields  = []string{"name", "action", "priority", "retry", "breaker", "rate_limit", "tracking"}
	breakerFields   = []string{"failure_threshold", "cooldown_ms", "half_open_max_calls"}
	rateLimitFields = []string{"max_per_second", "max_per_minute", "max_per_hour"}
	trackingFields  = []string{"mode", "timeout_ms"}
	healthFields    = []string{"window_ms", "decay", "min_samples"}
	cacheFields     = []string{"ttl_ms", "key", "invalidate_on"}
	fallbackFields  = []string{"value", "condition"}
	errorsFields    = []string{"retryable", "fatal"}

	selections         = []string{string(SelectStaticOrder), string(SelectRoundRobin), string(SelectRandom), string(SelectHealthWeighted)}
	trackingModes      = []string{"sync", "async"}
	fallbackConditions = []string{string(FallbackExhausted), string(FallbackAnyError)}
)

func (p *parser) plans(f field, def *Definition) {
	entries := p.section(f, "plan name to plan", "plan", CodeDuplicatePlan, MaxPlans)
	p.plansUnread = entries == nil && p.hasErrorAt(f.path)
	for _, e := range entries {
		if text.Name("name", e.name) != nil {
			// A target naming it is malformed by the same rule, so no step
			// can run it and it needs no place in brokenPlans.
			p.errorf(CodePlanName, e.key, e.path, "plan name %q is invalid: use 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", clip(e.name), nameMaxLen)
			continue
		}
		pl := p.plan(e)
		if pl == nil {
			p.brokenPlans[e.name] = true
			continue
		}
		def.Plans[e.name] = pl
	}
}

// plan reads one plan. It returns nil only when its body is not a mapping.
func (p *parser) plan(e field) *Plan {
	fields := p.object(e.value, e.path, "a plan", planFields)
	if fields == nil {
		return nil
	}
	pl := &Plan{Name: e.name, Pos: pos(e.key), Selection: DefaultSelection}
	selectionKnown := true
	if sf, ok := fields["selection"]; ok {
		if v, ok := p.str(sf, false); ok && contains(selections, v) {
			pl.Selection = Selection(v)
		} else {
			selectionKnown = false
			if ok {
				p.errorf(CodeSelection, sf.value, sf.path, "selection %q is not one of %s%s", clip(v), strings.Join(selections, ", "), suggest(v, selections))
			}
		}
	}
	if ef, ok := fields["executors"]; ok {
		pl.Executors = p.executors(ef)
	} else {
		p.errorf(CodeNoExecutors, e.key, e.path, "plan %s needs executors: at least one", e.name)
	}
	hf, hasHealth := fields["health"]
	if hasHealth {
		pl.Health = p.health(hf)
	}
	switch {
	case pl.Selection == SelectHealthWeighted && !hasHealth:
		sf := fields["selection"]
		p.errorf(CodeHealthRequired, sf.value, sf.path, "selection health-weighted needs a health block (window_ms, decay, min_samples) to score executors by")
	case hasHealth && selectionKnown && pl.Selection != SelectHealthWeighted:
		p.warnf(CodeHealthIgnored, hf.key, hf.path, "selection %s does not use health; only health-weighted does", pl.Selection)
	}
	if cf, ok := fields["cache"]; ok {
		pl.Cache = p.cache(cf)
	}
	if ff, ok := fields["fallback"]; ok {
		pl.Fallback = p.fallback(ff)
	}
	if ef, ok := fields["errors"]; ok {
		pl.Errors = p.errorClasses(ef)
	}
	return pl
}

func (p *parser) executors(f field) []*Executor {
	if f.value.Kind != yaml.SequenceNode {
		if f.value.Tag == "!!null" {
			p.errorf(CodeNoExecutors, f.value, f.path, "executors is empty; a plan needs at least one")
		} else {
			p.errorf(CodeType, f.value, f.path, "executors must be a list of executors, not %s", describe(f.value))
		}
		return nil
	}
	items := f.value.Content
	switch {
	case len(items) == 0:
		p.errorf(CodeNoExecutors, f.value, f.path, "executors is empty; a plan needs at least one")
		return nil
	case len(items) > MaxExecutors:
		p.errorf(CodeLimit, f.key, f.path, "%d executors; the limit is %d", len(items), MaxExecutors)
		return nil
	}
	seen := map[string]Position{}
	var out []*Executor
	for i, n := range items {
		path := fmt.Sprintf("%s[%d]", f.path, i)
		if n = p.deref(n, path); n == nil {
			continue
		}
		if ex := p.executor(n, path, seen); ex != nil {
			out = append(out, ex)
		}
	}
	return out
}

// executor reads one executor; seen holds the names of the plan's earlier
// executors and where they were written.
func (p *parser) executor(n *yaml.Node, path string, seen map[string]Position) *Executor {
	fields := p.object(n, path, "an executor", executorFields)
	if fields == nil {
		return nil
	}
	ex := &Executor{Pos: pos(n)}
	if nf, ok := fields["name"]; !ok {
		p.errorf(CodeExecutorName, n, path, "an executor needs a name")
	} else if v, ok := p.str(nf, false); ok {
		first, dup := seen[v]
		switch {
		case text.Name("name", v) != nil:
			p.errorf(CodeExecutorName, nf.value, nf.path, "executor name %q is invalid: use 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", clip(v), nameMaxLen)
		case dup:
			p.errorf(CodeDuplicateExecutor, nf.value, nf.path, "executor name %q is written twice in this plan (first at %s)", v, first)
		default:
			seen[v] = pos(nf.value)
			ex.Name = v
		}
	}
	if af, ok := fields["action"]; !ok {
		p.errorf(CodeExecutorAction, n, path, "an executor needs an action: @actions/NAME")
	} else if v, ok := p.str(af, false); ok {
		name, isAction := strings.CutPrefix(v, "@actions/")
		if !isAction || text.Name("name", name) != nil {
			p.errorf(CodeExecutorAction, af.value, af.path, "action %q must be @actions/NAME, NAME 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", clip(v), nameMaxLen)
		} else {
			ex.Action = name
		}
	}
	if pf, ok := fields["priority"]; ok {
		if v, ok := p.integer(pf); ok {
			ex.Priority = int(v)
		}
	}
	if rf, ok := fields["retry"]; ok {
		ex.Retry = p.retry(rf)
	}
	if bf, ok := fields["breaker"]; ok {
		ex.Breaker = p.breaker(bf)
	}
	if rf, ok := fields["rate_limit"]; ok {
		ex.RateLimit = p.rateLimit(rf)
	}
	if tf, ok := fields["tracking"]; ok {
		ex.Tracking = p.tracking(tf)
	}
	return ex
}

// count reads a whole number in [1, hi]; def when f is absent or wrong.
func (p *parser) count(f field, code Code, hi int64, def int) int {
	if f.value == nil {
		return def
	}
	v, ok := p.integer(f)
	if !ok {
		return def
	}
	if v < 1 || v > hi {
		p.errorf(code, f.value, f.path, "%s must be between 1 and %d, not %d", f.name, hi, v)
		return def
	}
	return int(v)
}

func (p *parser) breaker(f field) *Breaker {
	fields := p.object(f.value, f.path, "breaker", breakerFields)
	if fields == nil {
		return nil
	}
	b := &Breaker{
		FailureThreshold: p.count(fields["failure_threshold"], CodeBreaker, MaxBreakerCount, DefaultFailureThreshold),
		Cooldown:         DefaultCooldown,
		HalfOpenMaxCalls: p.count(fields["half_open_max_calls"], CodeBreaker, MaxBreakerCount, DefaultHalfOpenMaxCalls),
	}
	if cf, ok := fields["cooldown_ms"]; ok {
		if d, ok := p.millis(cf, CodeBreaker, time.Millisecond, MaxDelay); ok {
			b.Cooldown = d
		}
	}
	return b
}

// rateLimit returns nil for a block that sets no limit.
func (p *parser) rateLimit(f field) *RateLimit {
	fields := p.object(f.value, f.path, "rate_limit", rateLimitFields)
	if len(fields) == 0 {
		return nil
	}
	return &RateLimit{
		PerSecond: p.count(fields["max_per_second"], CodeRateLimit, MaxRateLimit, 0),
		PerMinute: p.count(fields["max_per_minute"], CodeRateLimit, MaxRateLimit, 0),
		PerHour:   p.count(fields["max_per_hour"], CodeRateLimit, MaxRateLimit, 0),
	}
}

func (p *parser) tracking(f field) Tracking {
	fields := p.object(f.value, f.path, "tracking", trackingFields)
	var t Tracking
	if fields == nil {
		return t
	}
	mode := "sync"
	if mf, ok := fields["mode"]; ok {
		v, ok := p.str(mf, false)
		if !ok {
			return t
		}
		if !contains(trackingModes, v) {
			p.errorf(CodeTrackingMode, mf.value, mf.path, "mode %q is not sync or async%s", clip(v), suggest(v, trackingModes))
			return t
		}
		mode = v
	}
	t.Async = mode == "async"
	if t.Async {
		t.Timeout = DefaultAsyncTimeout
	}
	if tf, ok := fields["timeout_ms"]; ok {
		if d, ok := p.millis(tf, CodeTrackingTimeout, time.Millisecond, MaxPlanTimeout); ok {
			if !t.Async {
				p.errorf(CodeTrackingTimeout, tf.key, tf.path, "timeout_ms applies to mode async only; a sync executor's time is its action's timeout")
			}
			t.Timeout = d
		}
	}
	return t
}

func (p *parser) health(f field) *Health {
	fields := p.object(f.value, f.path, "health", healthFields)
	if fields == nil {
		return nil
	}
	h := &Health{
		Window:     DefaultHealthWindow,
		Decay:      DefaultHealthDecay,
		MinSamples: p.count(fields["min_samples"], CodeHealthMinSamples, MaxHealthSamples, DefaultHealthMinSamples),
	}
	if wf, ok := fields["window_ms"]; ok {
		if d, ok := p.millis(wf, CodeHealthWindow, time.Millisecond, MaxDelay); ok {
			h.Window = d
		}
	}
	if df, ok := fields["decay"]; ok {
		if v, ok := p.number(df); ok {
			if v <= 0 || v > 1 {
				p.errorf(CodeHealthDecay, df.value, df.path, "decay must be in (0, 1]: above 0 and at most 1, not %g", v)
			} else {
				h.Decay = v
			}
		}
	}
	return h
}

func (p *parser) cache(f field) *Cache {
	fields := p.object(f.value, f.path, "cache", cacheFields)
	if fields == nil {
		return nil
	}
	c := &Cache{}
	if tf, ok := fields["ttl_ms"]; !ok {
		p.errorf(CodeCacheIncomplete, f.key, f.path, "cache needs ttl_ms: how long an outcome is served")
	} else if d, ok := p.millis(tf, CodeCacheTTL, time.Millisecond, MaxPlanTimeout); ok {
		c.TTL = d
	}
	if kf, ok := fields["key"]; !ok {
		p.errorf(CodeCacheIncomplete, f.key, f.path, "cache needs a key template, e.g. \"charge:{input.customer_id}\"")
	} else if v, ok := p.str(kf, false); ok {
		if v == "" {
			p.errorf(CodeCacheIncomplete, kf.value, kf.path, "the cache key is empty: every run would share one entry")
		} else if k, err := CompileCacheKey(v); err != nil {
			p.errorf(CodeCacheKey, kf.value, kf.path, "%s", err)
		} else {
			c.Key, c.keyPos = k, pos(kf.value)
		}
	}
	if ef, ok := fields["invalidate_on"]; ok {
		for _, e := range p.stringList(ef, CodeInvalidateEvent, func(s string) error { return text.SignalType("event", s) }) {
			c.InvalidateOn = append(c.InvalidateOn, e.name)
		}
	}
	return c
}

// stringList reads a list of strings, reporting with code each that check
// refuses and dropping repeats. Each entry comes back as a field whose name
// is the string.
func (p *parser) stringList(f field, code Code, check func(string) error) []field {
	if f.value.Kind != yaml.SequenceNode {
		p.errorf(CodeType, f.value, f.path, "%s must be a list of strings, not %s", f.name, describe(f.value))
		return nil
	}
	if len(f.value.Content) > MaxPlanListEntries {
		p.errorf(CodeLimit, f.key, f.path, "%d entries in %s; the limit is %d", len(f.value.Content), f.name, MaxPlanListEntries)
		return nil
	}
	var out []field
	seen := map[string]bool{}
	for i, n := range f.value.Content {
		e := field{name: f.name, key: f.key, value: p.deref(n, f.path), path: fmt.Sprintf("%s[%d]", f.path, i)}
		if e.value == nil {
			continue
		}
		v, ok := p.str(e, false)
		if !ok || seen[v] {
			continue
		}
		if err := check(v); err != nil {
			p.errorf(code, e.value, e.path, "%s", err)
			continue
		}
		seen[v] = true
		e.name = v
		out = append(out, e)
	}
	return out
}

func (p *parser) fallback(f field) *Fallback {
	fields := p.object(f.value, f.path, "fallback", fallbackFields)
	if fields == nil {
		return nil
	}
	fb := &Fallback{Condition: DefaultFallback}
	if vf, ok := fields["value"]; !ok {
		p.errorf(CodeFallbackValue, f.key, f.path, "fallback needs a value: the JSON the plan returns instead of failing")
	} else if v, ok := p.str(vf, false); ok {
		var b bytes.Buffer
		if err := json.Compact(&b, []byte(v)); err != nil {
			p.errorf(CodeFallbackValue, vf.value, vf.path, "fallback value is not JSON (%s); write JSON in a string, e.g. '{\"status\": \"declined\"}'", err)
		} else {
			fb.Value = b.Bytes()
		}
	}
	if cf, ok := fields["condition"]; ok {
		if v, ok := p.str(cf, false); ok {
			if contains(fallbackConditions, v) {
				fb.Condition = FallbackCondition(v)
			} else {
				p.errorf(CodeFallbackCondition, cf.value, cf.path, "condition %q is not exhausted or any_error%s", clip(v), suggest(v, fallbackConditions))
			}
		}
	}
	return fb
}

func (p *parser) errorClasses(f field) ErrorClasses {
	fields := p.object(f.value, f.path, "errors", errorsFields)
	var ec ErrorClasses
	if fields == nil {
		return ec
	}
	checkCode := func(s string) error { return text.ErrorCode("error code", s) }
	retryable := map[string]bool{}
	if rf, ok := fields["retryable"]; ok {
		for _, e := range p.stringList(rf, CodeErrorCode, checkCode) {
			retryable[e.name] = true
			ec.Retryable = append(ec.Retryable, e.name)
		}
	}
	if ff, ok := fields["fatal"]; ok {
		for _, e := range p.stringList(ff, CodeErrorCode, checkCode) {
			if retryable[e.name] {
				p.errorf(CodeErrorClassClash, e.value, e.path, "error code %q is both retryable and fatal; list it in one of them", e.name)
				continue
			}
			ec.Fatal = append(ec.Fatal, e.name)
		}
	}
	return ec
}

// paths returns the paths of the key's placeholders.
func (k *CacheKey) paths() []*mapping.Path {
	var out []*mapping.Path
	for _, part := range k.parts {
		if part.path != nil {
			out = append(out, part.path.Paths()...)
		}
	}
	return out
}
