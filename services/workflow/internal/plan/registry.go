// Package plan keeps one workflow replica's in-memory plan state: the health
// samples health-weighted selection scores executors by, each executor's
// circuit breaker (sony/gobreaker), the round-robin counters, and the plan
// metrics. Nothing here is shared between replicas or survives a restart; a
// restarted replica gives every executor a fresh chance, as the reference
// describes. Rate limits and the cache are shared and live in Postgres
// (internal/store).
//
// An attempt's end is one of three things:
//   - an API failure: the executor did not do the work. It failed with no
//     error code or a code that is not in the plan's errors.fatal, it timed
//     out, or its target was not found, disabled, or failed to execute.
//   - a business failure: the executor answered and refused the work. It
//     failed with a code in errors.fatal.
//   - neither: success, pending and named outcomes.
//
// Breakers count API failures only; a business failure counts as a success
// for the breaker, since the provider is up. Health scores count both: the
// API success rate over every sample, the business success rate over the
// samples whose API call succeeded.
package plan

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
)

// Bounds on what one executor keeps, so a replica whose attempts end
// elsewhere (their done never called here) or a very busy executor cannot
// grow without end; past them the oldest are dropped.
const (
	maxSamples = 10_000
	maxPending = 10_000
)

// Breaker states as Status names them; gobreaker's own names for the three.
const (
	BreakerNone     = "none"
	BreakerClosed   = "closed"
	BreakerHalfOpen = "half-open"
	BreakerOpen     = "open"
)

// The health score's weights and breaker penalties (the reference's
// formula).
const (
	apiWeight       = 0.7
	businessWeight  = 0.3
	openPenalty     = 0.1
	halfOpenPenalty = 0.5
)

var (
	// errAPIFailed is what a failed attempt reports to its breaker.
	errAPIFailed = errors.New("executor API failure")
	// errProbeLost is what a half-open probe that never ended here reports.
	errProbeLost = errors.New("half-open probe got no outcome in time")
)

// Registry holds the replica's plan state: health samples, breakers,
// round-robin counters, metrics. It is safe for concurrent use.
type Registry struct {
	now func() time.Time

	attempts  metric.Int64Counter
	skipped   metric.Int64Counter
	cache     metric.Int64Counter
	fallbacks metric.Int64Counter

	mu        sync.Mutex
	executors map[execKey]*executor
	rounds    map[engine.PlanRef]uint64
}

type execKey struct {
	ref  engine.PlanRef
	name string
}

// executor is the state of one executor of one plan.
type executor struct {
	// settings is the breaker block the breaker was made from: a new
	// workflow version that changes it gets a new breaker.
	settings definition.Breaker
	breaker  *gobreaker.TwoStepCircuitBreaker[struct{}]
	// probeTTL is how long a half-open probe may go without an outcome.
	probeTTL time.Duration
	// pending are the dones of attempts started here, by RunID/Token,
	// oldest first in order; probes are those of them that are probes.
	pending map[string]*list.Element
	order   list.List
	probes  []*list.Element
	// samples are the health samples, oldest first.
	samples []sample
	// starts counts attempts started here per second over the last minute.
	starts [60]secondCount
}

type pendingDone struct {
	id   string
	at   time.Time
	done func(error)
}

type sample struct {
	at          time.Time
	apiOK, bzOK bool
}

type secondCount struct {
	second int64
	n      int
}

// NewRegistry returns an empty registry whose metrics go to meter (which
// may be a no-op meter). now is the clock of health samples and pending
// attempts; nil means time.Now. Breakers keep gobreaker's own clock.
func NewRegistry(meter metric.Meter, now func() time.Time) (*Registry, error) {
	if now == nil {
		now = time.Now
	}
	r := &Registry{now: now, executors: map[execKey]*executor{}, rounds: map[engine.PlanRef]uint64{}}
	var err error
	if r.attempts, err = meter.Int64Counter("flo.plan.executor.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Plan executor attempts that ended on this replica, by outcome.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.skipped, err = meter.Int64Counter("flo.plan.skipped", metric.WithUnit("{executor}"),
		metric.WithDescription("Plan executors passed over, by reason (breaker_open, rate_limited).")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.cache, err = meter.Int64Counter("flo.plan.cache", metric.WithUnit("{lookup}"),
		metric.WithDescription("Plan cache lookups, by result (hit, miss).")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.fallbacks, err = meter.Int64Counter("flo.plan.fallbacks", metric.WithUnit("{invocation}"),
		metric.WithDescription("Plan invocations that returned their fallback value.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if _, err = meter.Int64ObservableGauge("flo.plan.breaker.state", metric.WithUnit("{state}"),
		metric.WithDescription("Plan executor circuit breakers on this replica: 0 closed, 1 half-open, 2 open."),
		metric.WithInt64Callback(r.observeBreakers)); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	return r, nil
}

// Order returns the executor names in the order this invocation tries them.
// draw returns a number in [0, 1) for the random selection; nil uses
// math/rand/v2.
func (r *Registry) Order(ref engine.PlanRef, p *definition.Plan, draw func() float64) []string {
	names := p.ByPriority()
	switch p.Selection {
	case definition.SelectRoundRobin:
		r.mu.Lock()
		n := r.rounds[ref]
		r.rounds[ref] = n + 1
		r.mu.Unlock()
		if len(names) > 0 {
			k := int(n % uint64(len(names)))
			names = append(names[k:], names[:k]...)
		}
	case definition.SelectRandom:
		if draw == nil {
			draw = rand.Float64
		}
		for i := len(names) - 1; i > 0; i-- {
			j := min(int(draw()*float64(i+1)), i)
			names[i], names[j] = names[j], names[i]
		}
	case definition.SelectHealthWeighted:
		now := r.now()
		scores := make(map[string]float64, len(names))
		r.mu.Lock()
		for _, name := range names {
			scores[name] = r.health(ref, p, name, now).score
		}
		r.mu.Unlock()
		// names are in priority order already, ties as written: a
		// stable sort by score keeps both tie-breaks.
		slices.SortStableFunc(names, func(a, b string) int { return cmp.Compare(scores[b], scores[a]) })
	}
	return names
}

// Breaker is the breaker half of admission, and reads only:
// SkipBreakerOpen when the executor's breaker is open, or half-open with
// every probe it allows in flight.
func (r *Registry) Breaker(ref engine.PlanRef, p *definition.Plan, ex *definition.Executor) engine.Admission {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.executor(ref, ex)
	if e.breaker == nil {
		return engine.Admission{}
	}
	r.expireProbes(e)
	switch e.breaker.State() {
	case gobreaker.StateOpen:
		return engine.Admission{Skip: engine.SkipBreakerOpen, Detail: "breaker open"}
	case gobreaker.StateHalfOpen:
		// gobreaker's own rule for refusing a half-open request.
		c := e.breaker.Counts()
		if c.Requests-min(c.Requests, c.TotalExclusions) >= uint32(max(1, e.settings.HalfOpenMaxCalls)) {
			return engine.Admission{Skip: engine.SkipBreakerOpen,
				Detail: fmt.Sprintf("breaker half-open with all %d probes in flight", e.settings.HalfOpenMaxCalls)}
		}
	}
	return engine.Admission{}
}

// Apply feeds events, after the transaction that recorded them committed,
// to the breakers, health samples and metrics.
func (r *Registry) Apply(ctx context.Context, events []engine.PlanEvent) {
	for _, ev := range events {
		attrs := []attribute.KeyValue{
			attribute.String("namespace", ev.Ref.Namespace), attribute.String("workflow", ev.Ref.Workflow),
			attribute.String("plan", ev.Ref.Plan),
		}
		switch ev.Kind {
		case engine.PlanAttemptStarted:
			r.attempt(ev)
		case engine.PlanAttemptEnded:
			r.attempt(ev)
			r.attempts.Add(ctx, 1, metric.WithAttributes(append(attrs,
				attribute.String("executor", ev.Executor), attribute.String("outcome", ev.Outcome))...))
		case engine.PlanSkipped:
			r.skipped.Add(ctx, 1, metric.WithAttributes(append(attrs,
				attribute.String("executor", ev.Executor), attribute.String("reason", string(ev.Skip)))...))
		case engine.PlanCacheHit:
			r.cache.Add(ctx, 1, metric.WithAttributes(append(attrs, attribute.String("result", "hit"))...))
		case engine.PlanCacheMiss:
			r.cache.Add(ctx, 1, metric.WithAttributes(append(attrs, attribute.String("result", "miss"))...))
		case engine.PlanFallbackUsed:
			r.fallbacks.Add(ctx, 1, metric.WithAttributes(attrs...))
		}
	}
}

// attempt applies an attempt's start or end to its executor.
func (r *Registry) attempt(ev engine.PlanEvent) {
	ex, ok := ev.Plan.Executor(ev.Executor)
	if !ok {
		return
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.executor(ev.Ref, ex)
	if ev.Kind == engine.PlanAttemptStarted {
		r.started(e, ev, now)
	} else {
		r.ended(e, ev, now)
	}
}

// started takes the attempt through its breaker and keeps the done for its
// end. An attempt the breaker refuses (another started it in the meantime)
// goes on without one: the engine admitted it already.
func (r *Registry) started(e *executor, ev engine.PlanEvent, now time.Time) {
	e.countStart(now)
	if e.breaker == nil {
		return
	}
	id := ev.RunID + "/" + ev.Token
	if _, ok := e.pending[id]; ok {
		return // applied twice: the first allow stands
	}
	r.expireProbes(e)
	probe := e.breaker.State() == gobreaker.StateHalfOpen
	done, err := e.breaker.Allow()
	if err != nil {
		return
	}
	el := e.order.PushBack(&pendingDone{id: id, at: now, done: done})
	e.pending[id] = el
	if probe {
		e.probes = append(e.probes, el)
	}
	for e.order.Len() > maxPending {
		e.drop(e.order.Front())
	}
}

// ended reports the attempt to its breaker and records a health sample.
func (r *Registry) ended(e *executor, ev engine.PlanEvent, now time.Time) {
	if e.breaker != nil {
		r.expireProbes(e)
		result := error(nil)
		if ev.APIFailed {
			result = errAPIFailed
		}
		if el, ok := e.pending[ev.RunID+"/"+ev.Token]; ok {
			el.Value.(*pendingDone).done(result)
			e.drop(el)
		} else if done, err := e.breaker.Allow(); err == nil {
			// The attempt started on another replica, or before a
			// restart: it still tells this replica's breaker how the
			// executor fares.
			done(result)
		}
	}
	e.samples = append(e.samples, sample{at: now, apiOK: !ev.APIFailed, bzOK: !ev.BusinessFailed})
	e.prune(window(ev.Plan), now)
}

// ExecutorStatus is what `flo workflow plans` shows about one executor.
type ExecutorStatus struct {
	Plan, Executor string
	// Score is the health score now, breaker penalty included.
	Score float64
	// Samples is how many health samples are inside the window.
	Samples                             int
	APISuccessRate, BusinessSuccessRate float64
	// Breaker is BreakerClosed, BreakerOpen, BreakerHalfOpen, or
	// BreakerNone for an executor without a breaker block.
	Breaker string
	// AttemptsLastMinute counts attempts started on this replica in the
	// last 60 seconds.
	AttemptsLastMinute int
}

// Status returns the state of every executor of p, as written.
func (r *Registry) Status(ref engine.PlanRef, p *definition.Plan) []ExecutorStatus {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ExecutorStatus, 0, len(p.Executors))
	for _, ex := range p.Executors {
		h := r.health(ref, p, ex.Name, now)
		e := r.executor(ref, ex)
		breaker := BreakerNone
		if e.breaker != nil {
			r.expireProbes(e)
			breaker = e.breaker.State().String()
		}
		out = append(out, ExecutorStatus{
			Plan: p.Name, Executor: ex.Name, Score: h.score, Samples: h.samples,
			APISuccessRate: h.api, BusinessSuccessRate: h.business, Breaker: breaker,
			AttemptsLastMinute: e.startsSince(now),
		})
	}
	return out
}

// executor returns ex's state, made or remade when its breaker settings are
// new. The caller holds r.mu.
func (r *Registry) executor(ref engine.PlanRef, ex *definition.Executor) *executor {
	k := execKey{ref, ex.Name}
	e := r.executors[k]
	if e == nil {
		e = &executor{}
		r.executors[k] = e
	}
	var settings definition.Breaker
	if ex.Breaker != nil {
		settings = *ex.Breaker
	}
	// A probe gets the cooldown to end, or an async executor's whole
	// timeout_ms when that is longer: failing a probe that is still
	// legitimately running would keep the breaker from ever closing.
	e.probeTTL = settings.Cooldown
	if ex.Tracking.Async {
		e.probeTTL = max(e.probeTTL, ex.Tracking.Timeout)
	}
	if e.breaker != nil && settings == e.settings || e.breaker == nil && ex.Breaker == nil {
		return e
	}
	e.settings, e.breaker, e.pending, e.probes = settings, nil, map[string]*list.Element{}, nil
	e.order.Init()
	if ex.Breaker != nil {
		threshold := uint32(settings.FailureThreshold)
		e.breaker = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
			Name:        ref.Namespace + "/" + ref.Workflow + "/" + ref.Plan + "/" + ex.Name,
			MaxRequests: uint32(settings.HalfOpenMaxCalls),
			Timeout:     settings.Cooldown,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= threshold },
		})
	}
	return e
}

// expireProbes fails the half-open probes that have had no outcome here for
// longer than probeTTL: their end went to another replica, or never came,
// and a probe slot held for ever would keep the breaker half-open with no
// room for another probe. The caller holds r.mu.
func (r *Registry) expireProbes(e *executor) {
	deadline := r.now().Add(-e.probeTTL)
	for _, el := range slices.Clone(e.probes) {
		if pd := el.Value.(*pendingDone); pd.at.Before(deadline) {
			pd.done(errProbeLost)
			e.drop(el)
		}
	}
}

// drop forgets a pending done.
func (e *executor) drop(el *list.Element) {
	delete(e.pending, el.Value.(*pendingDone).id)
	e.order.Remove(el)
	if i := slices.Index(e.probes, el); i >= 0 {
		e.probes = slices.Delete(e.probes, i, i+1)
	}
}

// prune drops the samples older than window, and the oldest past
// maxSamples.
func (e *executor) prune(window time.Duration, now time.Time) {
	cut := 0
	for cut < len(e.samples) && !e.samples[cut].at.After(now.Add(-window)) {
		cut++
	}
	cut = max(cut, len(e.samples)-maxSamples)
	if cut > 0 {
		e.samples = slices.Delete(e.samples, 0, cut)
	}
}

func (e *executor) countStart(now time.Time) {
	s := now.Unix()
	c := &e.starts[s%int64(len(e.starts))]
	if c.second != s {
		*c = secondCount{second: s}
	}
	c.n++
}

func (e *executor) startsSince(now time.Time) int {
	n, s := 0, now.Unix()
	for _, c := range e.starts {
		if c.second > s-int64(len(e.starts)) && c.second <= s {
			n += c.n
		}
	}
	return n
}

// health is an executor's health at one moment.
type health struct {
	score, api, business float64
	samples              int
}

// health scores the executor called name. The caller holds r.mu.
func (r *Registry) health(ref engine.PlanRef, p *definition.Plan, name string, now time.Time) health {
	h := health{score: 1, api: 1, business: 1}
	ex, ok := p.Executor(name)
	if !ok {
		return h
	}
	e := r.executor(ref, ex)
	cfg := healthSettings(p)
	var apiW, apiOK, bzW, bzOK float64
	w := 1.0
	for i := len(e.samples) - 1; i >= 0; i-- {
		s := e.samples[i]
		if !s.at.After(now.Add(-cfg.Window)) {
			break
		}
		h.samples++
		apiW += w
		if s.apiOK {
			apiOK += w
			bzW += w
			if s.bzOK {
				bzOK += w
			}
		}
		w *= cfg.Decay
	}
	if apiW > 0 {
		h.api = apiOK / apiW
	}
	if bzW > 0 {
		h.business = bzOK / bzW
	}
	if e.breaker != nil {
		r.expireProbes(e)
	}
	// Below min_samples an executor has no score yet: it is ordered by
	// priority, breaker or not, so a half-open executor is still probed
	// (admission skips an open one) instead of waiting behind healthy ones
	// for samples it can never get.
	if h.samples < cfg.MinSamples {
		return h
	}
	h.score = h.api*apiWeight + h.business*businessWeight
	if e.breaker != nil {
		switch e.breaker.State() {
		case gobreaker.StateOpen:
			h.score *= openPenalty
		case gobreaker.StateHalfOpen:
			h.score *= halfOpenPenalty
		}
	}
	return h
}

// healthSettings returns p's health block, or the defaults for a plan that
// has none (its samples still show in Status).
func healthSettings(p *definition.Plan) definition.Health {
	if p.Health != nil {
		return *p.Health
	}
	return definition.Health{Window: definition.DefaultHealthWindow, Decay: definition.DefaultHealthDecay, MinSamples: definition.DefaultHealthMinSamples}
}

func window(p *definition.Plan) time.Duration { return healthSettings(p).Window }

// observeBreakers reports every breaker's state.
func (r *Registry) observeBreakers(_ context.Context, o metric.Int64Observer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, e := range r.executors {
		if e.breaker == nil {
			continue
		}
		var v int64
		switch e.breaker.State() {
		case gobreaker.StateHalfOpen:
			v = 1
		case gobreaker.StateOpen:
			v = 2
		}
		o.Observe(v, metric.WithAttributes(
			attribute.String("namespace", k.ref.Namespace), attribute.String("workflow", k.ref.Workflow),
			attribute.String("plan", k.ref.Plan), attribute.String("executor", k.name)))
	}
	return nil
}
