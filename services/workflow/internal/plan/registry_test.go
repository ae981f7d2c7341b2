package plan_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/telemetry/telemetrytest"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/plan"
)

// fixture is a registry on a fake clock and the plan the test feeds it.
type fixture struct {
	t     *testing.T
	r     *plan.Registry
	clock *harness.Clock // the registry's injected clock; breakers keep the real one
	ref   engine.PlanRef
	plan  *definition.Plan
	runs  int
}

func newFixture(t *testing.T, p *definition.Plan) *fixture {
	t.Helper()
	c := harness.NewClock(time.Date(2026, 11, 24, 15, 0, 0, 0, time.UTC))
	r, err := plan.NewRegistry(noop.NewMeterProvider().Meter("test"), c.Now)
	require.NoError(t, err)
	return &fixture{t: t, r: r, clock: c, ref: engine.PlanRef{Namespace: "ns", Workflow: "checkout", Plan: p.Name}, plan: p}
}

// newPlan returns a plan of executors written "name:priority".
func newPlan(selection definition.Selection, executors ...string) *definition.Plan {
	p := &definition.Plan{Name: "payment", Selection: selection}
	for _, e := range executors {
		name, priority, _ := strings.Cut(e, ":")
		var prio int
		_, _ = fmt.Sscan(priority, &prio)
		p.Executors = append(p.Executors, &definition.Executor{Name: name, Action: name, Priority: prio})
	}
	return p
}

func (f *fixture) executor(name string) *definition.Executor {
	f.t.Helper()
	ex, ok := f.plan.Executor(name)
	require.True(f.t, ok, name)
	return ex
}

// start begins an attempt on executor and returns its id.
func (f *fixture) start(executor string) string {
	f.runs++
	run := fmt.Sprintf("run-%d", f.runs)
	f.r.Apply(f.t.Context(), []engine.PlanEvent{{Ref: f.ref, Plan: f.plan, Executor: executor, Kind: engine.PlanAttemptStarted, RunID: run, Token: "t"}})
	return run
}

// end ends the attempt of run: "success", "api" (an API failure) or
// "business" (a fatal code).
func (f *fixture) end(executor, run, how string) {
	ev := engine.PlanEvent{Ref: f.ref, Plan: f.plan, Executor: executor, Kind: engine.PlanAttemptEnded, RunID: run, Token: "t", Outcome: definition.OutcomeSuccess}
	switch how {
	case "api":
		ev.Outcome, ev.APIFailed = definition.OutcomeFailure, true
	case "business":
		ev.Outcome, ev.BusinessFailed = definition.OutcomeFailure, true
	}
	f.r.Apply(f.t.Context(), []engine.PlanEvent{ev})
}

// attempt runs one whole attempt on executor.
func (f *fixture) attempt(executor, how string) { f.end(executor, f.start(executor), how) }

func (f *fixture) status(executor string) plan.ExecutorStatus {
	f.t.Helper()
	for _, s := range f.r.Status(f.ref, f.plan) {
		if s.Executor == executor {
			return s
		}
	}
	f.t.Fatalf("no status of %s", executor)
	return plan.ExecutorStatus{}
}

func (f *fixture) order() []string { return f.r.Order(f.ref, f.plan, nil) }

func (f *fixture) admission(executor string) engine.Admission {
	return f.r.Breaker(f.ref, f.plan, f.executor(executor))
}

func TestOrderStaticIsPriorityThenAsWritten(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPlan(definition.SelectStaticOrder, "a:10", "b:50", "c:50", "d:0"))
	for range 3 {
		require.Equal(t, []string{"b", "c", "a", "d"}, f.order())
	}
}

func TestOrderRoundRobinRotatesPerPlan(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPlan(definition.SelectRoundRobin, "a:10", "b:50", "c:0"))
	require.Equal(t, []string{"b", "a", "c"}, f.order())
	require.Equal(t, []string{"a", "c", "b"}, f.order())

	// Another plan's counter is its own.
	other := engine.PlanRef{Namespace: "ns", Workflow: "refunds", Plan: "payment"}
	require.Equal(t, []string{"b", "a", "c"}, f.r.Order(other, f.plan, nil))

	require.Equal(t, []string{"c", "b", "a"}, f.order())
	require.Equal(t, []string{"b", "a", "c"}, f.order())
}

func TestOrderRandomShufflesWithDraw(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPlan(definition.SelectRandom, "a:3", "b:2", "c:1"))
	// A Fisher-Yates shuffle of a, b, c: draws 0.9 then 0.1 keep c last,
	// then swap b to the front.
	draws := []float64{0.9, 0.1}
	draw := func() float64 { d := draws[0]; draws = draws[1:]; return d }
	require.Equal(t, []string{"b", "a", "c"}, f.r.Order(f.ref, f.plan, draw))

	// The default source gives every order of three.
	seen := map[string]bool{}
	for range 1000 {
		seen[strings.Join(f.order(), ",")] = true
	}
	require.Len(t, seen, 6)
}

// cooldown is the breakers' cooldown where a test waits it out: gobreaker
// keeps the real clock. Short, for fast tests; long enough that an open
// breaker is still open at the next line on a busy machine.
const cooldown = 200 * time.Millisecond

// healthPlan is a health-weighted plan with a small window and min_samples.
func healthPlan() *definition.Plan {
	p := newPlan(definition.SelectHealthWeighted, "stripe:100", "adyen:50", "braintree:50")
	p.Health = &definition.Health{Window: time.Minute, Decay: 0.5, MinSamples: 3}
	return p
}

func TestHealthScoreMath(t *testing.T) {
	t.Parallel()
	f := newFixture(t, healthPlan())
	// Oldest first: an API failure, a success, a business failure, a
	// success. Newest first the weights are 1, 0.5, 0.25, 0.125.
	for _, how := range []string{"api", "success", "business", "success"} {
		f.attempt("stripe", how)
		f.clock.Advance(time.Second)
	}
	s := f.status("stripe")
	api := (1 + 0.5 + 0.25) / (1 + 0.5 + 0.25 + 0.125)
	business := (1 + 0.25) / (1 + 0.5 + 0.25)
	require.Equal(t, 4, s.Samples)
	require.InDelta(t, api, s.APISuccessRate, 1e-9)
	require.InDelta(t, business, s.BusinessSuccessRate, 1e-9)
	require.InDelta(t, api*0.7+business*0.3, s.Score, 1e-9)
	require.Equal(t, plan.BreakerNone, s.Breaker)

	// Below min_samples an executor scores as healthy, rates shown.
	f.attempt("adyen", "api")
	f.attempt("adyen", "api")
	s = f.status("adyen")
	require.Equal(t, 2, s.Samples)
	require.Zero(t, s.APISuccessRate)
	require.Equal(t, 1.0, s.BusinessSuccessRate, "no API success: nothing to judge the business by")
	require.Equal(t, 1.0, s.Score)
	f.attempt("adyen", "api")
	require.InDelta(t, 0.3, f.status("adyen").Score, 1e-9, "an executor that never answers keeps the business share")

	// Samples leave the window: the oldest two of stripe's at 60 s.
	f.clock.Advance(time.Minute - 4*time.Second + time.Second)
	s = f.status("stripe")
	require.Equal(t, 2, s.Samples)
	require.Equal(t, 1.0, s.Score, "under min_samples again")
	f.clock.Advance(time.Minute)
	s = f.status("stripe")
	require.Zero(t, s.Samples)
	require.Equal(t, 1.0, s.APISuccessRate)
	require.Equal(t, 1.0, s.Score)
}

func TestHealthScoreBreakerPenalties(t *testing.T) {
	t.Parallel()
	p := healthPlan()
	p.Executors[0].Breaker = &definition.Breaker{FailureThreshold: 2, Cooldown: cooldown, HalfOpenMaxCalls: 1}
	f := newFixture(t, p)
	for range 3 {
		f.attempt("stripe", "success")
	}
	f.attempt("stripe", "api")
	f.attempt("stripe", "api")
	s := f.status("stripe")
	require.Equal(t, plan.BreakerOpen, s.Breaker)
	unpenalized := s.APISuccessRate*0.7 + s.BusinessSuccessRate*0.3
	require.InDelta(t, unpenalized*0.1, s.Score, 1e-9)

	f.waitHalfOpen("stripe")
	require.InDelta(t, unpenalized*0.5, f.status("stripe").Score, 1e-9)
}

// An executor keeps at most 10,000 samples, however many its window holds.
func TestHealthSamplesCapped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, healthPlan())
	f.attempt("stripe", "api")
	for range 10_000 {
		f.end("stripe", "elsewhere", "success")
	}
	require.Equal(t, 10_000, f.status("stripe").Samples)
}

func TestHealthWeightedMovesAwayAndBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, healthPlan())
	require.Equal(t, []string{"stripe", "adyen", "braintree"}, f.order(), "no samples: priority order, ties as written")

	f.attempt("braintree", "business")
	for range 3 {
		f.attempt("stripe", "api")
		f.attempt("braintree", "success")
	}
	// adyen, unmeasured, scores 1; braintree refused one charge of four.
	require.Equal(t, []string{"adyen", "braintree", "stripe"}, f.order())

	// stripe recovers: its failures age out of the window, and its new
	// successes are too few to count yet.
	f.clock.Advance(time.Minute)
	f.attempt("stripe", "success")
	require.Equal(t, []string{"stripe", "adyen", "braintree"}, f.order())
}

// breakerPlan is a static-order plan whose stripe executor has a breaker.
func breakerPlan(threshold, halfOpen int, cool time.Duration) *definition.Plan {
	p := newPlan(definition.SelectStaticOrder, "stripe:100", "adyen:50")
	p.Executors[0].Breaker = &definition.Breaker{FailureThreshold: threshold, Cooldown: cool, HalfOpenMaxCalls: halfOpen}
	return p
}

func TestBreakerOpensOnConsecutiveAPIFailuresOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t, breakerPlan(3, 1, time.Hour))
	for range 5 {
		f.attempt("stripe", "business")
	}
	f.attempt("stripe", "api")
	f.attempt("stripe", "api")
	f.attempt("stripe", "success")
	f.attempt("stripe", "api")
	f.attempt("stripe", "api")
	require.Equal(t, plan.BreakerClosed, f.status("stripe").Breaker, "business failures and a success between keep it closed")
	require.Equal(t, engine.Admission{}, f.admission("stripe"))

	f.attempt("stripe", "api")
	require.Equal(t, plan.BreakerOpen, f.status("stripe").Breaker)
	require.Equal(t, engine.Admission{Skip: engine.SkipBreakerOpen, Detail: "breaker open"}, f.admission("stripe"))
	require.Equal(t, engine.Admission{}, f.admission("adyen"), "no breaker block, never skipped")
	require.Equal(t, plan.BreakerNone, f.status("adyen").Breaker)

	// An attempt that ends while the breaker is open still counts for
	// health.
	f.attempt("stripe", "api")
	require.Equal(t, 12, f.status("stripe").Samples)
}

// Attempts that started on another replica, or before a restart, end here
// with no pending done: they still count.
func TestBreakerCountsAttemptsStartedElsewhere(t *testing.T) {
	t.Parallel()
	f := newFixture(t, breakerPlan(2, 1, time.Hour))
	f.end("stripe", "elsewhere-1", "api")
	require.Equal(t, plan.BreakerClosed, f.status("stripe").Breaker)
	f.end("stripe", "elsewhere-2", "api")
	require.Equal(t, plan.BreakerOpen, f.status("stripe").Breaker)
	f.end("stripe", "elsewhere-3", "success")
	s := f.status("stripe")
	require.Equal(t, plan.BreakerOpen, s.Breaker)
	require.Equal(t, 3, s.Samples)
	require.Zero(t, s.AttemptsLastMinute, "none started here")
}

// waitHalfOpen waits out the breaker's cooldown, on the real clock.
func (f *fixture) waitHalfOpen(executor string) {
	f.t.Helper()
	require.Eventually(f.t, func() bool { return f.status(executor).Breaker == plan.BreakerHalfOpen }, 5*time.Second, 5*time.Millisecond)
}

func TestBreakerHalfOpenProbes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, breakerPlan(1, 2, cooldown))
	f.attempt("stripe", "api")
	require.Equal(t, engine.SkipBreakerOpen, f.admission("stripe").Skip)

	f.waitHalfOpen("stripe")
	require.Equal(t, engine.Admission{}, f.admission("stripe"))
	p1 := f.start("stripe")
	require.Equal(t, engine.Admission{}, f.admission("stripe"), "one probe of two in flight")
	p2 := f.start("stripe")
	full := engine.Admission{Skip: engine.SkipBreakerOpen, Detail: "breaker half-open with all 2 probes in flight"}
	require.Equal(t, full, f.admission("stripe"))

	// Both probes must succeed to close it.
	f.end("stripe", p1, "success")
	require.Equal(t, plan.BreakerHalfOpen, f.status("stripe").Breaker)
	require.Equal(t, full, f.admission("stripe"))
	f.end("stripe", p2, "business")
	require.Equal(t, plan.BreakerClosed, f.status("stripe").Breaker, "a business failure is a working provider")
	require.Equal(t, engine.Admission{}, f.admission("stripe"))

	// A failed probe opens it again.
	f.attempt("stripe", "api")
	f.waitHalfOpen("stripe")
	f.attempt("stripe", "api")
	require.Equal(t, plan.BreakerOpen, f.status("stripe").Breaker)
	require.Equal(t, engine.Admission{Skip: engine.SkipBreakerOpen, Detail: "breaker open"}, f.admission("stripe"))
}

func TestBreakerLostProbeExpires(t *testing.T) {
	t.Parallel()
	f := newFixture(t, breakerPlan(1, 1, cooldown))
	f.attempt("stripe", "api")
	f.waitHalfOpen("stripe")
	lost := f.start("stripe")
	require.Equal(t, engine.SkipBreakerOpen, f.admission("stripe").Skip)

	// Past the cooldown with no outcome, the probe counts as a failure:
	// the breaker opens again instead of waiting on it for ever.
	f.clock.Advance(time.Second)
	require.Equal(t, engine.Admission{Skip: engine.SkipBreakerOpen, Detail: "breaker open"}, f.admission("stripe"))
	f.waitHalfOpen("stripe")

	// Its outcome arriving after all is an attempt like any other: here,
	// the probe that closes the breaker.
	f.end("stripe", lost, "success")
	require.Equal(t, plan.BreakerClosed, f.status("stripe").Breaker)
}

// An async executor's probe may take its whole timeout_ms.
func TestBreakerAsyncProbeHasItsTimeout(t *testing.T) {
	t.Parallel()
	p := breakerPlan(1, 1, cooldown)
	p.Executors[0].Tracking = definition.Tracking{Async: true, Timeout: 10 * time.Minute}
	f := newFixture(t, p)
	f.attempt("stripe", "api")
	f.waitHalfOpen("stripe")
	f.start("stripe")
	f.clock.Advance(time.Minute)
	require.Equal(t, plan.BreakerHalfOpen, f.status("stripe").Breaker, "still within its timeout")
	f.clock.Advance(10 * time.Minute)
	require.Equal(t, plan.BreakerOpen, f.status("stripe").Breaker)
}

func TestBreakerRemadeForNewSettings(t *testing.T) {
	t.Parallel()
	f := newFixture(t, breakerPlan(1, 1, time.Hour))
	f.attempt("stripe", "api")
	require.Equal(t, plan.BreakerOpen, f.status("stripe").Breaker)

	// A new version of the workflow: same plan, another threshold.
	f.plan = breakerPlan(2, 1, time.Hour)
	require.Equal(t, plan.BreakerClosed, f.status("stripe").Breaker)
	f.attempt("stripe", "api")
	require.Equal(t, plan.BreakerClosed, f.status("stripe").Breaker)
	f.attempt("stripe", "api")
	require.Equal(t, plan.BreakerOpen, f.status("stripe").Breaker)

	// Without a breaker block it has none.
	f.plan = newPlan(definition.SelectStaticOrder, "stripe:100", "adyen:50")
	require.Equal(t, plan.BreakerNone, f.status("stripe").Breaker)
	require.Equal(t, engine.Admission{}, f.admission("stripe"))
}

func TestStatus(t *testing.T) {
	t.Parallel()
	f := newFixture(t, breakerPlan(5, 1, time.Hour))
	for range 3 {
		f.start("stripe")
	}
	f.clock.Advance(30 * time.Second)
	f.attempt("stripe", "success")
	f.attempt("adyen", "api")
	require.Equal(t, []plan.ExecutorStatus{
		{Plan: "payment", Executor: "stripe", Score: 1, Samples: 1, APISuccessRate: 1, BusinessSuccessRate: 1, Breaker: plan.BreakerClosed, AttemptsLastMinute: 4},
		{Plan: "payment", Executor: "adyen", Score: 1, Samples: 1, APISuccessRate: 0, BusinessSuccessRate: 1, Breaker: plan.BreakerNone, AttemptsLastMinute: 1},
	}, f.r.Status(f.ref, f.plan), "scores of 1: under the default min_samples")

	f.clock.Advance(31 * time.Second)
	s := f.status("stripe")
	require.Equal(t, 1, s.AttemptsLastMinute, "the three of 61 s ago are out")
	f.clock.Advance(time.Minute)
	require.Zero(t, f.status("stripe").AttemptsLastMinute)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	metrics := telemetrytest.New(t)
	p := breakerPlan(1, 1, time.Hour)
	r, err := plan.NewRegistry(metrics.Meter("test"), nil)
	require.NoError(t, err)
	ref := engine.PlanRef{Namespace: "ns", Workflow: "checkout", Plan: "payment"}
	event := func(kind engine.PlanEventKind, executor string, mod func(*engine.PlanEvent)) engine.PlanEvent {
		ev := engine.PlanEvent{Ref: ref, Plan: p, Executor: executor, Kind: kind, RunID: "r", Token: "t"}
		if mod != nil {
			mod(&ev)
		}
		return ev
	}
	r.Apply(t.Context(), []engine.PlanEvent{
		event(engine.PlanAttemptStarted, "stripe", nil),
		event(engine.PlanAttemptEnded, "stripe", func(ev *engine.PlanEvent) { ev.Outcome, ev.APIFailed = definition.OutcomeTimeout, true }),
		event(engine.PlanSkipped, "stripe", func(ev *engine.PlanEvent) { ev.Skip = engine.SkipBreakerOpen }),
		event(engine.PlanAttemptEnded, "adyen", func(ev *engine.PlanEvent) { ev.Outcome = definition.OutcomeSuccess }),
		event(engine.PlanAttemptEnded, "adyen", func(ev *engine.PlanEvent) { ev.Outcome = definition.OutcomeSuccess }),
		event(engine.PlanCacheMiss, "", nil),
		event(engine.PlanCacheMiss, "", nil),
		event(engine.PlanCacheHit, "", nil),
		event(engine.PlanFallbackUsed, "", nil),
	})
	attrs := []attribute.KeyValue{attribute.String("namespace", "ns"), attribute.String("workflow", "checkout"), attribute.String("plan", "payment")}
	with := func(kv ...attribute.KeyValue) []attribute.KeyValue { return append(slices.Clone(attrs), kv...) }
	want := map[string][]attribute.KeyValue{
		"flo.plan.executor.attempts 1": with(attribute.String("executor", "stripe"), attribute.String("outcome", "timeout")),
		"flo.plan.executor.attempts 2": with(attribute.String("executor", "adyen"), attribute.String("outcome", "success")),
		"flo.plan.skipped 1":           with(attribute.String("executor", "stripe"), attribute.String("reason", "breaker_open")),
		"flo.plan.cache 2":             with(attribute.String("result", "miss")),
		"flo.plan.cache 1":             with(attribute.String("result", "hit")),
		"flo.plan.fallbacks 1":         attrs,
		"flo.plan.breaker.state 2":     with(attribute.String("executor", "stripe")),
	}
	for k, kv := range want {
		name, value, _ := strings.Cut(k, " ")
		got, ok := metrics.Value(name, kv...)
		require.True(t, ok, k)
		require.Equal(t, value, fmt.Sprint(got), k)
	}
	_, ok := metrics.Value("flo.plan.breaker.state", with(attribute.String("executor", "adyen"))...)
	require.False(t, ok, "adyen has no breaker")
}

// The registry is used by every runner goroutine at once (run with -race).
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	p := breakerPlan(3, 2, time.Millisecond)
	p.Selection, p.Health = definition.SelectHealthWeighted, &definition.Health{Window: time.Minute, Decay: 0.9, MinSamples: 1}
	r, err := plan.NewRegistry(noop.NewMeterProvider().Meter("test"), nil)
	require.NoError(t, err)
	ref := engine.PlanRef{Namespace: "ns", Workflow: "checkout", Plan: "payment"}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				ex := p.Executors[i%2]
				run := fmt.Sprintf("%d-%d", g, i)
				r.Order(ref, p, nil)
				r.Breaker(ref, p, ex)
				r.Apply(t.Context(), []engine.PlanEvent{
					{Ref: ref, Plan: p, Executor: ex.Name, Kind: engine.PlanAttemptStarted, RunID: run, Token: "t"},
					{Ref: ref, Plan: p, Executor: ex.Name, Kind: engine.PlanAttemptEnded, RunID: run, Token: "t", APIFailed: i%3 == 0},
				})
				r.Status(ref, p)
			}
		})
	}
	wg.Wait()
	total := 0
	for _, s := range r.Status(ref, p) {
		total += s.Samples
	}
	require.Equal(t, 800, total)
}
