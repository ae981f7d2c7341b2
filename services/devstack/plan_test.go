package devstack_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
)

// paymentInput is the input of the reference's payment-processing workflow.
type paymentInput struct {
	CustomerID     string  `json:"customer_id"`
	Amount         float64 `json:"amount"`
	IdempotencyKey string  `json:"idempotency_key"`
}

// providers implements the four actions of payment-processing as a user's
// workers would. charge-stripe is tracked asynchronously: its handler only
// accepts the charge and a "webhook" goroutine reports the provider's answer
// by completion token, as stripe's webhook handler would. What each provider
// answers is set by the test.
type providers struct {
	c *flo.Client

	mu sync.Mutex
	// stripe and adyen say what the next calls answer: "ok", "pending",
	// "fatal" (invalid_card) or "down" (rate_limited, an API failure).
	stripe, adyen string
	calls         map[string][]string // action -> customer ids, in call order
	webhookErrs   []error
}

func (p *providers) set(stripe, adyen string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stripe, p.adyen = stripe, adyen
}

func (p *providers) record(action, customer string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[action] = append(p.calls[action], customer)
}

func (p *providers) count(action string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls[action])
}

func (p *providers) mode(stripe bool) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if stripe {
		return p.stripe
	}
	return p.adyen
}

func (p *providers) register(w *flo.ActionWorker) {
	w.MustRegisterAction("charge-stripe", func(actx *flo.ActionContext) ([]byte, error) {
		var in paymentInput
		if err := actx.Into(&in); err != nil {
			return nil, err
		}
		p.record("charge-stripe", in.CustomerID)
		mode, token := p.mode(true), actx.CompletionToken()
		go p.webhook(token, in.CustomerID, mode)
		return nil, flo.ErrResultPending
	})
	w.MustRegisterAction("charge-adyen", func(actx *flo.ActionContext) (interface{}, error) {
		var in paymentInput
		if err := actx.Into(&in); err != nil {
			return nil, err
		}
		p.record("charge-adyen", in.CustomerID)
		switch p.mode(false) {
		case "pending":
			return actx.Result("pending", map[string]any{"payment_id": "adyen-" + in.CustomerID, "state": "processing"})
		case "fatal":
			return nil, flo.NewErrorWithCode("invalid_card", "adyen: card refused")
		}
		return map[string]any{"payment_id": "adyen-" + in.CustomerID, "provider": "adyen"}, nil
	})
	w.MustRegisterAction("check-payment-status", func(actx *flo.ActionContext) ([]byte, error) {
		var in struct {
			PaymentID string `json:"payment_id"`
		}
		if err := actx.Into(&in); err != nil {
			return nil, err
		}
		p.record("check-payment-status", in.PaymentID)
		return actx.Bytes(map[string]any{"payment_id": in.PaymentID, "state": "settled"})
	})
	w.MustRegisterAction("send-notification", func(actx *flo.ActionContext) ([]byte, error) {
		var in struct {
			CustomerID string `json:"customer_id"`
		}
		if err := actx.Into(&in); err != nil {
			return nil, err
		}
		p.record("send-notification", in.CustomerID)
		return actx.Bytes(map[string]any{"sent": true})
	})
}

// webhook reports stripe's answer for one charge by completion token.
func (p *providers) webhook(token, customer, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), runWait)
	defer cancel()
	var err error
	switch mode {
	case "ok":
		_, err = p.c.CompleteTask(ctx, token, []byte(fmt.Sprintf(`{"payment_id": "stripe-%s", "provider": "stripe"}`, customer)), "")
	case "pending":
		_, err = p.c.CompleteTask(ctx, token, []byte(fmt.Sprintf(`{"payment_id": "stripe-%s", "state": "processing"}`, customer)), "pending")
	case "fatal":
		_, err = p.c.FailTask(ctx, token, flo.NewErrorWithCode("invalid_card", "stripe: card refused"))
	default:
		_, err = p.c.FailTask(ctx, token, flo.NewErrorWithCode("rate_limited", "stripe: try later"))
	}
	if err != nil {
		p.mu.Lock()
		p.webhookErrs = append(p.webhookErrs, err)
		p.mu.Unlock()
	}
}

// planLines are a run's plan_* history events as "type detail-prefix": the
// executor's name and, for starts, the attempt.
func planLines(t *testing.T, c *flo.Client, runID string) []string {
	t.Helper()
	evs, err := c.GetRunHistory(context.Background(), runID)
	require.NoError(t, err)
	var out []string
	for _, ev := range evs {
		if !strings.HasPrefix(ev.Type, "plan_") {
			continue
		}
		detail := ev.Detail
		if i := strings.IndexAny(detail, " :"); i > 0 && ev.Type != "plan_cache_hit" && ev.Type != "plan_cache_miss" {
			detail = strings.TrimSpace(detail[:i])
		}
		out = append(out, ev.Type+" "+detail)
	}
	return out
}

// TestPaymentProcessingPlanEndToEnd runs the reference's payment-processing
// example, unchanged, with SDK workers: a fatal code moves to the fallback
// executor; failures open the primary's breaker and later runs skip it; after
// the cooldown probes close it again; a pending outcome goes to the polling
// step; a second run with one cache key is served from the cache, and an
// invalidation makes the next call an executor again.
func TestPaymentProcessingPlanEndToEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client(t, "default")
	ctx := context.Background()
	p := &providers{c: e.client(t, "default"), calls: map[string][]string{}}
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 8}, p.register)
	waitActions(t, c, "charge-stripe", "charge-adyen", "check-payment-status", "send-notification")
	// The reference's polling step has no timeout transition: the one
	// warning of the example, which is stored.
	_, warnings, err := c.CreateWorkflow(ctx, exampleYAML(t, "payment-processing"))
	require.NoError(t, err)
	require.Len(t, warnings, 1)
	require.Equal(t, "W502", warnings[0].Code)

	// The workflow requires a start idempotency key; every run gets its
	// own, while the payment's idempotency_key (part of the cache key) may
	// repeat.
	starts := 0
	run := func(customer, key string) (string, *flo.Run) {
		t.Helper()
		starts++
		started, err := c.StartWorkflow(ctx, "payment-processing", paymentInput{CustomerID: customer, Amount: 42, IdempotencyKey: key},
			flo.StartWorkflowOptions{IdempotencyKey: fmt.Sprintf("start-%d", starts)})
		require.NoError(t, err)
		return started.RunID, awaitRun(t, c, started.RunID, flo.RunCompleted)
	}
	// startOutput is the start step's outcome and output.
	startOutput := func(r *flo.Run) (string, string) {
		t.Helper()
		for _, o := range statusJSON(t, r).Outputs {
			if o.Step == "_start" {
				return o.Outcome, string(o.Output)
			}
		}
		t.Fatalf("run %s has no output of _start", r.ID)
		return "", ""
	}

	// 1. The primary refuses the card (a fatal code): no retry of it, the
	// fallback executor serves.
	p.set("fatal", "ok")
	id, r := run("c-1", "k-1")
	require.Equal(t, []string{
		"plan_cache_miss charge:c-1:k-1",
		"plan_executor_start stripe-primary",
		"plan_executor_exhausted stripe-primary",
		"plan_executor_start adyen-fallback",
		"plan_executor_success adyen-fallback",
	}, planLines(t, c, id))
	outcome, output := startOutput(r)
	require.Equal(t, "success", outcome)
	require.JSONEq(t, `{"payment_id": "adyen-c-1", "provider": "adyen"}`, output)
	require.Equal(t, []string{"c-1"}, p.calls["send-notification"])

	// 2. The primary is down: three attempts (its retry block), then the
	// fallback. 3. Two more failures make five in a row: the breaker opens
	// and the third attempt is skipped.
	p.set("down", "ok")
	id, _ = run("c-2", "k-2")
	require.Equal(t, []string{
		"plan_cache_miss charge:c-2:k-2",
		"plan_executor_start stripe-primary",
		"plan_executor_retry stripe-primary",
		"plan_executor_start stripe-primary",
		"plan_executor_retry stripe-primary",
		"plan_executor_start stripe-primary",
		"plan_executor_exhausted stripe-primary",
		"plan_executor_start adyen-fallback",
		"plan_executor_success adyen-fallback",
	}, planLines(t, c, id))
	id, _ = run("c-3", "k-3")
	opened := time.Now()
	require.Equal(t, []string{
		"plan_cache_miss charge:c-3:k-3",
		"plan_executor_start stripe-primary",
		"plan_executor_retry stripe-primary",
		"plan_executor_start stripe-primary",
		"plan_executor_retry stripe-primary",
		"plan_breaker_skip stripe-primary",
		"plan_executor_start adyen-fallback",
		"plan_executor_success adyen-fallback",
	}, planLines(t, c, id))
	stripeCalls := p.count("charge-stripe")
	require.Equal(t, 6, stripeCalls)
	require.Equal(t, "open", breakerOf(t, c, "stripe-primary"))

	// 4. With the breaker open the primary is not called at all; the
	// fallback answers pending and the run polls check-payment-status,
	// which reads $.steps._start.output.
	p.set("ok", "pending")
	id, r = run("c-4", "k-4")
	require.Equal(t, []string{
		"plan_cache_miss charge:c-4:k-4",
		"plan_breaker_skip stripe-primary",
		"plan_executor_start adyen-fallback",
		"plan_executor_success adyen-fallback",
	}, planLines(t, c, id))
	require.Equal(t, stripeCalls, p.count("charge-stripe"))
	require.Contains(t, runHistory(t, c, id), "step_started check_payment_status")
	require.Equal(t, []string{"adyen-c-4"}, p.calls["check-payment-status"])
	outcome, _ = startOutput(r)
	require.Equal(t, "pending", outcome)

	// 5. After the cooldown (30 s in the example) the breaker is half-open:
	// three successful probes (half_open_max_calls) close it.
	p.set("ok", "ok")
	require.Eventually(t, func() bool { return time.Since(opened) > 31*time.Second }, time.Minute, 100*time.Millisecond)
	for i := range 4 {
		customer := fmt.Sprintf("c-probe-%d", i)
		id, r = run(customer, "k")
		require.Equal(t, []string{
			"plan_cache_miss charge:" + customer + ":k",
			"plan_executor_start stripe-primary",
			"plan_executor_success stripe-primary",
		}, planLines(t, c, id), "probe %d", i)
		_, output = startOutput(r)
		require.JSONEq(t, fmt.Sprintf(`{"payment_id": "stripe-%s", "provider": "stripe"}`, customer), output)
	}
	require.Equal(t, stripeCalls+4, p.count("charge-stripe"))
	require.Equal(t, "closed", breakerOf(t, c, "stripe-primary"))

	// 6. The same cache key again: served from the cache, no executor runs.
	adyenCalls := p.count("charge-adyen")
	id, r = run("c-1", "k-1")
	require.Equal(t, []string{"plan_cache_hit charge:c-1:k-1"}, planLines(t, c, id))
	_, output = startOutput(r)
	require.JSONEq(t, `{"payment_id": "adyen-c-1", "provider": "adyen"}`, output)
	require.Equal(t, stripeCalls+4, p.count("charge-stripe"))
	require.Equal(t, adyenCalls, p.count("charge-adyen"))

	// 7. A refund invalidates the entry: the next run calls an executor.
	removed, err := c.InvalidatePlanCache(ctx, "payment.refunded", "charge:c-1:k-1")
	require.NoError(t, err)
	require.Equal(t, int64(1), removed)
	id, _ = run("c-1", "k-1")
	// Which executor serves is health-weighted's choice: stripe-primary now
	// has ten samples in the window (min_samples), five of them API
	// failures, so it scores about 0.68 while adyen-fallback, with fewer
	// than ten, still scores 1.0 and goes first.
	require.Equal(t, []string{
		"plan_cache_miss charge:c-1:k-1",
		"plan_executor_start adyen-fallback",
		"plan_executor_success adyen-fallback",
	}, planLines(t, c, id))
	require.Equal(t, adyenCalls+1, p.count("charge-adyen"))
	p.mu.Lock()
	require.Empty(t, p.webhookErrs)
	p.mu.Unlock()
}

// breakerOf reads an executor's breaker state of payment-processing's plan
// as the workflow service reports it.
func breakerOf(t *testing.T, c *flo.Client, executor string) string {
	t.Helper()
	plans, err := c.GetWorkflowPlans(context.Background(), "payment-processing", "")
	require.NoError(t, err)
	require.Len(t, plans.Plans, 1)
	for _, ex := range plans.Plans[0].Executors {
		if ex.Name == executor {
			return ex.Breaker
		}
	}
	t.Fatalf("no executor %s in %+v", executor, plans.Plans[0])
	return ""
}
