package definition_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

func parseFile(t *testing.T, name string) (*definition.Definition, []definition.Diagnostic) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	def, diags, err := definition.Parse(src)
	require.NoError(t, err, "%v", diags)
	return def, diags
}

func TestReferenceExamplesParseClean(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"process-order.yaml", "order-processing.yaml", "enrich-and-poll.yaml", "reconcile-accounts.yaml", "order-processor.yaml"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, diags := parseFile(t, name)
			require.Empty(t, diags)
		})
	}
}

// TestRepositoryExamplesMatchTestdata keeps examples/workflows, which users
// copy, identical to what these tests parse.
func TestRepositoryExamplesMatchTestdata(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "..", "..", "..", "examples", "workflows")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		example, err := os.ReadFile(f)
		require.NoError(t, err)
		testdata, err := os.ReadFile(filepath.Join("testdata", filepath.Base(f)))
		require.NoError(t, err, "examples/workflows/%s has no copy in testdata", filepath.Base(f))
		require.Equal(t, string(testdata), string(example), filepath.Base(f))
	}
}

func TestProcessOrderModel(t *testing.T) {
	t.Parallel()
	def, _ := parseFile(t, "process-order.yaml")
	require.Equal(t, "process-order", def.Name)
	require.Equal(t, "1.0.0", def.Version)
	require.Equal(t, definition.IdempotencyRequired, def.Idempotency)
	require.Equal(t, []string{"charge", "ship"}, def.StepOrder)

	require.Equal(t, definition.StartStep, def.Start.Name)
	require.Equal(t, &definition.Target{Kind: definition.TargetAction, Name: "validate-order"}, def.Start.Run)
	require.Equal(t, map[string]string{"success": "charge", "failure": "flo.Failed"}, def.Start.Transitions)
	require.Nil(t, def.Start.Retry)
	require.Equal(t, definition.Position{Line: 6, Column: 3}, def.Start.Pos)

	charge, ok := def.Step("charge")
	require.True(t, ok)
	require.Equal(t, definition.Position{Line: 11, Column: 3}, charge.Pos)
	require.Equal(t, &definition.Retry{
		MaxAttempts:  3,
		Backoff:      backoff.Exponential,
		InitialDelay: time.Second,
		MaxDelay:     30 * time.Second,
		Multiplier:   2,
	}, charge.Retry)
	p := charge.Retry.Policy()
	require.NoError(t, p.Validate())
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}, []time.Duration{p.Delay(1), p.Delay(2), p.Delay(3)})

	start, ok := def.Step(definition.StartStep)
	require.True(t, ok)
	require.Same(t, def.Start, start)
	_, ok = def.Step("nope")
	require.False(t, ok)
}

func TestOrderProcessingModel(t *testing.T) {
	t.Parallel()
	def, _ := parseFile(t, "order-processing.yaml")
	require.Equal(t, map[string]definition.Terminal{
		"OrderCompleted": {Name: "OrderCompleted", Status: definition.StatusCompleted, Pos: definition.Position{Line: 6, Column: 3}},
		"OrderRejected":  {Name: "OrderRejected", Status: definition.StatusFailed, Pos: definition.Position{Line: 8, Column: 3}},
		"PaymentFailed":  {Name: "PaymentFailed", Status: definition.StatusFailed, Pos: definition.Position{Line: 10, Column: 3}},
	}, def.Terminals)

	wait, ok := def.Step("await_approval")
	require.True(t, ok)
	require.Nil(t, wait.Run)
	require.Equal(t, "approval", wait.Wait.Type)
	require.Equal(t, time.Hour, wait.Wait.Timeout)
	require.Equal(t, "OrderRejected", wait.Wait.OnTimeout)
	require.Equal(t, map[string]string{"success": "fulfill"}, wait.Transitions)

	pay, _ := def.Step("process_payment")
	require.Equal(t, 5*time.Minute, pay.Retry.MaxDelay, "max_delay_ms defaults to 5 minutes")

	term, ok := def.Terminal("OrderRejected")
	require.True(t, ok)
	require.Equal(t, definition.StatusFailed, term.Status)
	require.False(t, term.BuiltIn)
	term, ok = def.Terminal(definition.TerminalTimedOut)
	require.True(t, ok)
	require.Equal(t, definition.Terminal{Name: "flo.TimedOut", Status: definition.StatusTimedOut, BuiltIn: true}, term)
	_, ok = def.Terminal("fulfill")
	require.False(t, ok)
}

func TestEnrichAndPollModel(t *testing.T) {
	t.Parallel()
	def, _ := parseFile(t, "enrich-and-poll.yaml")
	require.Equal(t, "2.1", def.Version, "a numeric version keeps its written text")
	require.Equal(t, definition.IdempotencyNone, def.Idempotency)

	out, err := def.Start.InputMapping.Resolve(&mapping.Context{Step: definition.StartStep, Input: json.RawMessage(`{"customer_id":"c1","company_domain":"x.co"}`)})
	require.NoError(t, err)
	require.JSONEq(t, `{"customer_id":"c1","domain":"x.co"}`, string(out))

	charge, _ := def.Step("charge")
	require.Equal(t, &definition.Retry{MaxAttempts: 5, Backoff: backoff.ExponentialJitter, InitialDelay: 500 * time.Millisecond, MaxDelay: 30 * time.Second, Multiplier: 2, Within: 2 * time.Minute}, charge.Retry)
	p := charge.Retry.Policy()
	require.Equal(t, backoff.StepJitter, p.JitterFraction)
	require.Equal(t, 2*time.Minute, p.Within)
	require.Equal(t, 625*time.Millisecond, p.DelayWithDraw(1, 1), "exponential_jitter adds up to 25%")

	check, _ := def.Step("check_status")
	require.Equal(t, &definition.Poll{MaxAttempts: 30, Backoff: backoff.Exponential, InitialDelay: 2 * time.Second, BaseDelay: 2 * time.Second, MaxDelay: 30 * time.Second, Multiplier: 2}, check.Poll)
	var delays []time.Duration
	for n := 1; n <= 6; n++ {
		delays = append(delays, check.Poll.Delay(n, 0))
	}
	require.Equal(t, []time.Duration{2 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second}, delays)

	fulfil, _ := def.Step("fulfil")
	require.Equal(t, &definition.Target{Kind: definition.TargetWorkflow, Name: "fulfillment", Version: "2.0.0"}, fulfil.Run)
	require.Equal(t, "@workflow/fulfillment:2.0.0", fulfil.Run.String())
}

func TestPollDefaults(t *testing.T) {
	t.Parallel()
	def, _, err := definition.Parse([]byte(`kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  poll: {backoff: linear, baseDelayMs: 500}
  transitions: {success: flo.Completed, timeout: flo.TimedOut}
`))
	require.NoError(t, err)
	pl := def.Start.Poll
	require.Equal(t, definition.DefaultPollMaxAttempts, pl.MaxAttempts)
	require.Equal(t, 500*time.Millisecond, pl.InitialDelay, "initialDelayMs defaults to baseDelayMs")
	require.Equal(t, []time.Duration{500 * time.Millisecond, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond}, []time.Duration{pl.Delay(1, 0), pl.Delay(2, 0), pl.Delay(3, 0), pl.Delay(4, 0)})
}

func TestRetryDefaults(t *testing.T) {
	t.Parallel()
	def, _, err := definition.Parse([]byte(`kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  retry: {max_delay_ms: 200}
  transitions: {success: flo.Completed}
`))
	require.NoError(t, err)
	require.Equal(t, &definition.Retry{MaxAttempts: 3, Backoff: backoff.Exponential, InitialDelay: 200 * time.Millisecond, MaxDelay: 200 * time.Millisecond, Multiplier: 2}, def.Start.Retry,
		"a max below the default initial delay pulls the initial delay down")
}

// TestPaymentProcessingModel parses the reference's plans example as written.
func TestPaymentProcessingModel(t *testing.T) {
	t.Parallel()
	def, diags := parseFile(t, "payment-processing.yaml")
	// The reference's polling step has no timeout transition; the warning
	// says so and is the only diagnostic.
	require.Len(t, diags, 1, "%v", diags)
	require.Equal(t, definition.CodePollWithoutTimeoutTo, diags[0].Code)

	require.Equal(t, &definition.Target{Kind: definition.TargetPlan, Name: "charge-payment"}, def.Start.Run)
	require.NotNil(t, def.Start.InputMapping, "inputMapping applies to a plan step")
	require.Len(t, def.Plans, 1)
	plan, ok := def.Plan("charge-payment")
	require.True(t, ok)
	_, ok = def.Plan("nope")
	require.False(t, ok)

	require.Equal(t, "charge-payment", plan.Name)
	require.Equal(t, definition.Position{Line: 6, Column: 3}, plan.Pos)
	require.Equal(t, definition.SelectHealthWeighted, plan.Selection)
	require.Equal(t, []*definition.Executor{
		{
			Name:     "stripe-primary",
			Pos:      definition.Position{Line: 9, Column: 9},
			Action:   "charge-stripe",
			Priority: 100,
			Retry: &definition.Retry{
				MaxAttempts:  3,
				Backoff:      backoff.Exponential,
				InitialDelay: time.Second,
				MaxDelay:     30 * time.Second,
				Multiplier:   2,
				Within:       2 * time.Minute,
			},
			Breaker:   &definition.Breaker{FailureThreshold: 5, Cooldown: 30 * time.Second, HalfOpenMaxCalls: 3},
			RateLimit: &definition.RateLimit{PerSecond: 100},
			Tracking:  definition.Tracking{Async: true, Timeout: 5 * time.Minute},
		},
		{
			Name:     "adyen-fallback",
			Pos:      definition.Position{Line: 27, Column: 9},
			Action:   "charge-adyen",
			Priority: 50,
			Retry: &definition.Retry{
				MaxAttempts:  2,
				Backoff:      backoff.ExponentialJitter,
				InitialDelay: time.Second,
				MaxDelay:     5 * time.Minute,
				Multiplier:   2,
			},
		},
	}, plan.Executors)
	ex, ok := plan.Executor("adyen-fallback")
	require.True(t, ok)
	require.Same(t, plan.Executors[1], ex)

	require.Equal(t, &definition.Health{Window: 5 * time.Minute, Decay: 0.9, MinSamples: 10}, plan.Health)

	require.Equal(t, time.Hour, plan.Cache.TTL)
	require.Equal(t, []string{"payment.refunded"}, plan.Cache.InvalidateOn)
	require.Equal(t, "charge:{input.customer_id}:{input.idempotency_key}", plan.Cache.Key.String())
	key, ok := plan.Cache.Key.Render(&mapping.Context{Step: definition.StartStep, Input: json.RawMessage(`{"customer_id":"c-1","idempotency_key":"k-1","amount":10}`)})
	require.True(t, ok)
	require.Equal(t, "charge:c-1:k-1", key)

	require.Equal(t, &definition.Fallback{
		Value:     json.RawMessage(`{"status":"declined","reason":"all_providers_unavailable"}`),
		Condition: definition.FallbackExhausted,
	}, plan.Fallback)
	require.Equal(t, definition.ErrorClasses{
		Retryable: []string{"timeout", "rate_limited"},
		Fatal:     []string{"invalid_card", "fraud_detected"},
	}, plan.Errors)
	require.True(t, plan.Errors.IsFatal("fraud_detected"))
	require.False(t, plan.Errors.IsFatal("timeout"))
}

// TestPlanDefaults parses a plan that writes only what it must.
func TestPlanDefaults(t *testing.T) {
	t.Parallel()
	def, diags, err := definition.Parse([]byte(`kind: Workflow
name: x
version: "1"
plans:
  p:
    executors:
      - name: a
        action: "@actions/a"
        breaker: {}
        rate_limit: {}
        tracking: {mode: async}
      - name: b
        action: "@actions/b"
        tracking: {mode: sync}
    fallback: {value: '"declined"'}
start:
  run: "@plan/p"
  retry: {max_attempts: 2}
  poll: {maxAttempts: 3}
  transitions: {success: flo.Completed, timeout: flo.TimedOut}
`))
	require.NoError(t, err, "%v", diags)
	require.Empty(t, diags)
	plan, ok := def.Plan("p")
	require.True(t, ok)
	require.Equal(t, definition.SelectStaticOrder, plan.Selection)
	a, b := plan.Executors[0], plan.Executors[1]
	require.Zero(t, a.Priority)
	require.Nil(t, a.Retry)
	require.Equal(t, &definition.Breaker{FailureThreshold: definition.DefaultFailureThreshold, Cooldown: definition.DefaultCooldown, HalfOpenMaxCalls: definition.DefaultHalfOpenMaxCalls}, a.Breaker)
	require.Nil(t, a.RateLimit, "a rate_limit that sets nothing limits nothing")
	require.Equal(t, definition.Tracking{Async: true, Timeout: definition.DefaultAsyncTimeout}, a.Tracking)
	require.Equal(t, definition.Tracking{}, b.Tracking)
	require.Nil(t, b.Breaker)
	require.Nil(t, plan.Health)
	require.Nil(t, plan.Cache)
	require.Equal(t, &definition.Fallback{Value: json.RawMessage(`"declined"`), Condition: definition.DefaultFallback}, plan.Fallback)
	require.Equal(t, definition.ErrorClasses{}, plan.Errors)
	require.Equal(t, 2, def.Start.Retry.MaxAttempts, "retry applies to a plan step")
	require.Equal(t, 3, def.Start.Poll.MaxAttempts, "poll applies to a plan step")
}

func TestNext(t *testing.T) {
	t.Parallel()
	step := &definition.Step{Transitions: map[string]string{
		"success":           "ship",
		"failure":           "flo.Failed",
		"execution_failure": "Broken",
		"out_of_stock":      "Backorder",
	}}
	onlyFailure := &definition.Step{Transitions: map[string]string{"success": "ship", "failure": "flo.Failed"}}
	tests := []struct {
		name        string
		step        *definition.Step
		outcome     string
		wantTarget  string
		wantMatched string
		wantOK      bool
	}{
		{"success matches", step, "success", "ship", "success", true},
		{"named outcome matches", step, "out_of_stock", "Backorder", "out_of_stock", true},
		{"business outcome without transition does not fall back", step, "timeout", "", "", false},
		{"pending does not fall back to failure", onlyFailure, "pending", "", "", false},
		{"unknown named outcome", step, "approved", "", "", false},
		{"target_not_found falls to execution_failure", step, "target_not_found", "Broken", "execution_failure", true},
		{"target_disabled falls to execution_failure", step, "target_disabled", "Broken", "execution_failure", true},
		{"execution_failure matches", step, "execution_failure", "Broken", "execution_failure", true},
		{"target_not_found falls through to failure", onlyFailure, "target_not_found", "flo.Failed", "failure", true},
		{"execution_failure falls to failure", onlyFailure, "execution_failure", "flo.Failed", "failure", true},
		{"own transition wins", &definition.Step{Transitions: map[string]string{"target_not_found": "Missing", "failure": "flo.Failed"}}, "target_not_found", "Missing", "target_not_found", true},
		{"no transitions", &definition.Step{}, "failure", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			target, matched, ok := tt.step.Next(tt.outcome)
			require.Equal(t, tt.wantOK, ok)
			require.Equal(t, tt.wantTarget, target)
			require.Equal(t, tt.wantMatched, matched)
		})
	}
}

func TestFallbackChain(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"target_not_found", "execution_failure", "failure"}, definition.FallbackChain("target_not_found"))
	require.Equal(t, []string{"execution_failure", "failure"}, definition.FallbackChain("execution_failure"))
	require.Equal(t, []string{"timeout"}, definition.FallbackChain("timeout"))
	require.True(t, definition.IsExecutionOutcome("target_disabled"))
	require.False(t, definition.IsExecutionOutcome("failure"))
}

func TestValidationErrorIsInvalidFault(t *testing.T) {
	t.Parallel()
	_, diags, err := definition.Parse([]byte("kind: Job\n"))
	require.Error(t, err)
	kind, msg, ok := fault.KindOf(err)
	require.True(t, ok)
	require.Equal(t, fault.Invalid, kind)
	require.Contains(t, msg, "1:7 E103 kind: kind must be Workflow")
	require.Contains(t, msg, "E102 name: the workflow needs a name field")
	var ve *definition.ValidationError
	require.True(t, errors.As(err, &ve))
	require.Equal(t, diags, ve.Diagnostics)
	require.Equal(t, diags, definition.Validate([]byte("kind: Job\n")))
}

func TestDiagnosticsAreSortedAndCapped(t *testing.T) {
	t.Parallel()
	src := "kind: Workflow\nname: x\nversion: \"1\"\nstart: {run: \"@actions/a\", transitions: {success: flo.Completed}}\nsteps:\n"
	for i := range 300 {
		src += "  s" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + ": {run: \"@actions/a\", transitions: {success: nowhere}}\n"
	}
	_, diags, err := definition.Parse([]byte(src))
	require.Error(t, err)
	require.Len(t, diags, 100)
	for i := 1; i < len(diags); i++ {
		require.LessOrEqual(t, diags[i-1].Pos.Line, diags[i].Pos.Line)
	}
	require.Contains(t, err.Error(), "and 90 more")
}

func TestAliasesWork(t *testing.T) {
	t.Parallel()
	def, diags, err := definition.Parse([]byte(`kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  retry: &standard
    max_attempts: 4
    backoff: linear
  transitions: {success: b}
steps:
  b:
    run: "@actions/b"
    retry: *standard
    transitions: {success: flo.Completed}
`))
	require.NoError(t, err, "%v", diags)
	b, _ := def.Step("b")
	require.Equal(t, def.Start.Retry, b.Retry)
	require.Equal(t, 4, b.Retry.MaxAttempts)
}

func TestSelfReferencingAliasDoesNotLoop(t *testing.T) {
	t.Parallel()
	_, _, err := definition.Parse([]byte(`kind: Workflow
name: x
version: "1"
start: &s
  run: "@actions/a"
  transitions: *s
`))
	require.Error(t, err)
}

func TestLoopBackToStartIsAllowed(t *testing.T) {
	t.Parallel()
	def, diags, err := definition.Parse([]byte(`kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: again, failure: flo.Failed}
steps:
  again:
    run: "@actions/b"
    inputMapping: '{"prev": "$.steps._start.outcome"}'
    transitions: {success: _start, done: flo.Completed}
`))
	require.NoError(t, err, "%v", diags)
	require.Empty(t, diags)
	again, _ := def.Step("again")
	target, _, ok := again.Next("success")
	require.True(t, ok)
	require.Equal(t, definition.StartStep, target)
}

func TestCodesAreUnique(t *testing.T) {
	t.Parallel()
	seen := map[definition.Code]bool{}
	for _, c := range definition.Codes {
		require.False(t, seen[c.Code], "code %s listed twice", c.Code)
		require.NotEmpty(t, c.Summary)
		seen[c.Code] = true
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"process-order.yaml", "order-processing.yaml", "enrich-and-poll.yaml", "payment-processing.yaml", "reconcile-accounts.yaml"} {
		src, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(f, err)
		f.Add(src)
	}
	for _, c := range codeCases {
		if len(c.src) < 4096 {
			f.Add([]byte(c.src))
		}
	}
	for _, src := range planSeeds {
		f.Add([]byte(src))
	}
	for _, src := range scheduleSeeds {
		f.Add([]byte(src))
	}
	for _, src := range searchSeeds {
		f.Add([]byte(src))
	}
	for _, src := range triggerSeeds {
		f.Add([]byte(src))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		def, diags, err := definition.Parse(src)
		if err != nil {
			var ve *definition.ValidationError
			require.ErrorAs(t, err, &ve)
			require.Nil(t, def)
			return
		}
		require.NotNil(t, def)
		require.NotNil(t, def.Start)
		if s := def.Schedule; s != nil {
			require.True(t, (s.Cron == "") != (s.Interval == 0), "a schedule has cron or interval")
			require.GreaterOrEqual(t, s.MaxConcurrent, 1)
			require.True(t, json.Valid(s.Input))
			now := time.Now()
			require.True(t, s.First(now).After(now))
		}
		for _, d := range diags {
			require.Equal(t, definition.Warning, d.Severity)
		}
		checkSearchAttributes(t, def.SearchAttributes)
		// A valid definition is closed: every transition goes somewhere.
		steps := []*definition.Step{def.Start}
		for _, name := range def.StepOrder {
			steps = append(steps, def.Steps[name])
		}
		for _, s := range steps {
			require.True(t, (s.Run == nil) != (s.Wait == nil), "step %s runs and waits", s.Name)
			if s.Run != nil && s.Run.Kind == definition.TargetPlan {
				_, ok := def.Plan(s.Run.Name)
				require.True(t, ok, "step %s runs unknown plan %q", s.Name, s.Run.Name)
			}
			for _, target := range s.Transitions {
				_, isStep := def.Step(target)
				_, isTerminal := def.Terminal(target)
				require.True(t, isStep || isTerminal, "step %s goes to unknown %q", s.Name, target)
			}
		}
		for name, plan := range def.Plans {
			checkPlan(t, name, plan)
		}
	})
}

// checkPlan asserts what every plan of a valid definition holds.
func checkPlan(t *testing.T, name string, plan *definition.Plan) {
	require.Equal(t, name, plan.Name)
	require.NotEmpty(t, plan.Executors, "plan %s", name)
	seen := map[string]bool{}
	for _, ex := range plan.Executors {
		require.NotEmpty(t, ex.Action, "plan %s executor %s", name, ex.Name)
		require.False(t, seen[ex.Name], "plan %s repeats executor %s", name, ex.Name)
		seen[ex.Name] = true
		require.Equal(t, ex.Tracking.Async, ex.Tracking.Timeout > 0, "plan %s executor %s tracking", name, ex.Name)
		if b := ex.Breaker; b != nil {
			require.True(t, b.FailureThreshold >= 1 && b.HalfOpenMaxCalls >= 1 && b.Cooldown > 0, "plan %s breaker %+v", name, b)
		}
	}
	if plan.Selection == definition.SelectHealthWeighted {
		require.NotNil(t, plan.Health, "plan %s", name)
	}
	if h := plan.Health; h != nil {
		require.True(t, h.Decay > 0 && h.Decay <= 1 && h.MinSamples >= 1 && h.Window > 0, "plan %s health %+v", name, h)
	}
	if c := plan.Cache; c != nil {
		require.NotNil(t, c.Key, "plan %s", name)
		require.Positive(t, c.TTL, "plan %s", name)
	}
	if fb := plan.Fallback; fb != nil {
		require.True(t, json.Valid(fb.Value), "plan %s fallback %q", name, fb.Value)
	}
	for _, code := range plan.Errors.Fatal {
		require.NotContains(t, plan.Errors.Retryable, code, "plan %s", name)
	}
}

// planSeeds cover every plan field, and broken plans, for FuzzParse.
var planSeeds = []string{
	`kind: Workflow
name: x
version: "1"
plans:
  p:
    selection: round-robin
    executors:
      - name: a
        action: "@actions/a"
        priority: -3
        retry: {max_attempts: 4, backoff: linear, initial_delay_ms: 10, max_delay_ms: 100, multiplier: 3, within_ms: 5000}
        breaker: {failure_threshold: 2, cooldown_ms: 100, half_open_max_calls: 2}
        rate_limit: {max_per_second: 1, max_per_minute: 10, max_per_hour: 100}
        tracking: {mode: async, timeout_ms: 1000}
      - {name: b, action: "@actions/b", tracking: {mode: sync}}
    cache: {ttl_ms: 60000, key: "k:{input.id}:{flo.run_id}:{steps._start.outcome}", invalidate_on: [a.b, "c:d"]}
    fallback: {value: '[1, {"a": null}]', condition: any_error}
    errors: {retryable: [t1, t1], fatal: ["f.1", "f:2"]}
  q:
    selection: health-weighted
    executors: [{name: c, action: "@actions/c"}]
    health: {window_ms: 1000, decay: 1, min_samples: 1}
start:
  run: "@plan/p"
  inputMapping: '{"id": "$.input.id"}'
  retry: {max_attempts: 2}
  transitions: {success: s, failure: flo.Failed}
steps:
  s:
    run: "@plan/q"
    poll: {maxAttempts: 2}
    transitions: {success: flo.Completed, timeout: flo.Failed}
`,
	`kind: Workflow
name: x
version: "1"
plans: [p]
start: {run: "@plan/p", transitions: {success: flo.Completed}}
`,
	`kind: Workflow
name: x
version: "1"
plans:
  p:
    executors: {name: a}
    selection: [random]
    health: 3
    cache: {key: "{input.a[*]}", ttl_ms: 1.5, invalidate_on: payment}
    fallback: {value: {a: 1}, condition: [x]}
    errors: {fatal: "x", retryable: [{a: b}]}
start: {run: "@plan/p", transitions: {success: flo.Completed}}
`,
	`kind: Workflow
name: x
version: "1"
plans:
  p: &e
    executors:
      - &x {name: a, action: "@actions/a", breaker: {cooldown_ms: 99999999999}}
      - *x
      - {name: b, action: "@workflow/b", rate_limit: {max_per_hour: 0}, tracking: {timeout_ms: 5}}
  q: *e
  "":
    executors: []
start: {run: "@plan/r", transitions: {success: flo.Completed}}
`,
}

func TestOneMistakeOneDiagnostic(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{
			name: "step that is not a mapping",
			src: `kind: Workflow
name: x
version: "1"
start: {run: "@actions/a", transitions: {success: ship}}
steps:
  ship: "@actions/ship"
`,
			want: []string{`6:9 E105 steps.ship: a step must be a mapping, not the string "@actions/ship"`},
		},
		{
			name: "step with a malformed name",
			src: `kind: Workflow
name: x
version: "1"
start: {run: "@actions/a", transitions: {success: ship.it}}
steps:
  ship.it: {run: "@actions/ship", transitions: {success: flo.Completed}}
`,
			want: []string{`6:3 E110 steps.ship.it: step name "ship.it" is invalid: use a letter or '_', then letters, digits, '_' or '-'`},
		},
		{
			name: "broken transitions block",
			src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: [success, flo.Completed]
`,
			want: []string{`6:16 E105 start.transitions: transitions must be a mapping of outcome to step or terminal, not a list`},
		},
		{
			name: "plans section that is not a mapping",
			src: `kind: Workflow
name: x
version: "1"
plans: [p]
start: {run: "@plan/p", transitions: {success: flo.Completed}}
`,
			want: []string{`4:8 E105 plans: plans must be a mapping of plan name to plan, not a list`},
		},
		{
			name: "plan that is not a mapping",
			src: `kind: Workflow
name: x
version: "1"
plans:
  p: "@actions/a"
start: {run: "@plan/p", transitions: {success: flo.Completed}}
`,
			want: []string{`5:6 E105 plans.p: a plan must be a mapping, not the string "@actions/a"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, diags, err := definition.Parse([]byte(tt.src))
			require.Error(t, err)
			var got []string
			for _, d := range diags {
				got = append(got, d.String())
			}
			require.Equal(t, tt.want, got)
		})
	}
}
