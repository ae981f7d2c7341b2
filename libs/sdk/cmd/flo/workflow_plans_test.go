package main

import (
	"regexp"
	"strings"
	"testing"

	flo "github.com/razorbill/flo-go"
	"github.com/stretchr/testify/require"
)

// payYAML charges through a two-executor plan whose outcomes are cached by order id.
const payYAML = `kind: Workflow
name: pay
version: "1"
idempotency: optional
plans:
  payment:
    selection: health-weighted
    executors:
      - name: primary
        action: "@actions/charge-payment"
        priority: 100
        breaker:
          failure_threshold: 3
          cooldown_ms: 30000
      - name: backup
        action: "@actions/validate-order"
        priority: 50
        breaker:
          failure_threshold: 3
    health:
      window_ms: 60000
      decay: 0.9
      min_samples: 5
    cache:
      ttl_ms: 600000
      key: "charge:{input.order_id}"
      invalidate_on: ["order.refunded", "customer.deleted"]
start:
  run: "@plan/payment"
  transitions:
    success: flo.Completed
    failure: flo.Failed
`

// cliPlans is what `workflow plans --json` prints.
type cliPlans struct {
	flo.WorkflowPlans
	Note string `json:"note"`
}

// TestWorkflowPlansAndCacheCommands shows a plan's executors before and after a run, and
// invalidates the cache entry the run left.
func TestWorkflowPlansAndCacheCommands(t *testing.T) {
	s := startWorkflowStack(t)
	s.ok(t, "workflow", "create", "-f", writeFile(t, "pay.yaml", payYAML))

	// Before any run every executor is healthy with a closed breaker.
	table := s.ok(t, "workflow", "plans", "pay")
	require.Regexp(t, `^workflow pay version 1, as replica \S+ sees it\n`, table)
	require.Contains(t, table, "kept in memory by each workflow replica and reset when it restarts")
	require.Contains(t, table, "plan payment (health-weighted)")
	require.Regexp(t, `(?m)^\s+EXECUTOR\s+ACTION\s+PRIORITY\s+SCORE\s+SAMPLES\s+API OK\s+BUSINESS OK\s+BREAKER\s+ATTEMPTS/MIN$`, table)
	require.Regexp(t, `(?m)^\s+primary\s+charge-payment\s+100\s+1\.000\s+0\s+1\.000\s+1\.000\s+closed\s+0$`, table)
	require.Regexp(t, `(?m)^\s+backup\s+validate-order\s+50\s+1\.000\s+0\s+1\.000\s+1\.000\s+closed\s+0$`, table)

	plans := decode[cliPlans](t, s.ok(t, "workflow", "plans", "pay", "--version", "1", "--json"))
	require.Contains(t, plans.Note, "reset when it restarts")
	require.NotEmpty(t, plans.Replica)
	require.Equal(t, "myapp", plans.Namespace)
	require.Equal(t, "pay", plans.Workflow)
	require.Equal(t, "1", plans.Version)
	require.Len(t, plans.Plans, 1)
	require.Equal(t, "payment", plans.Plans[0].Name)
	require.Equal(t, "health-weighted", plans.Plans[0].Selection)
	require.Equal(t, []flo.ExecutorStatus{
		{Name: "primary", Action: "charge-payment", Priority: 100, Score: 1, APISuccessRate: 1, BusinessSuccessRate: 1, Breaker: "closed"},
		{Name: "backup", Action: "validate-order", Priority: 50, Score: 1, APISuccessRate: 1, BusinessSuccessRate: 1, Breaker: "closed"},
	}, plans.Plans[0].Executors, "in the order the definition lists them")

	for _, args := range [][]string{{"plans", "nope"}, {"plans", "pay", "--version", "9"}} {
		code, stdout, stderr := s.cli(t, append([]string{"workflow"}, args...)...)
		require.Equal(t, 1, code, args)
		require.Empty(t, stdout, args)
		require.Contains(t, stderr, "NotFound", args)
	}

	// An empty cache has nothing to remove; a bad event is refused.
	require.JSONEq(t, `{"event":"order.refunded","removed":0}`, s.ok(t, "workflow", "cache", "invalidate", "--event", "order.refunded"))
	code, stdout, stderr := s.cli(t, "workflow", "cache", "invalidate", "--event", ".refunded", "--key", "charge:o-1")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Regexp(t, `^flo: invalidate plan cache on \.refunded: .*InvalidArgument.*event "\.refunded" is invalid`, stderr)

	// A run goes through the primary, which the replica now counts, and leaves a cache entry
	// that its event removes, once.
	run := decode[cliRun](t, s.ok(t, "workflow", "start", "pay", `{"order_id":"o-1"}`, "--wait", "--timeout", "1m"))
	require.Equal(t, "completed", run.Status)
	history := s.ok(t, "workflow", "history", run.RunID)
	require.Regexp(t, `(?m)^\s*\d+  \S+  plan_executor_start\s+step=_start\s+.*primary`, history)
	require.Regexp(t, `(?m)^\s*\d+  \S+  plan_executor_success\s+step=_start\s+.*primary`, history)

	plans = decode[cliPlans](t, s.ok(t, "workflow", "plans", "pay", "--json"))
	primary := plans.Plans[0].Executors[0]
	require.Equal(t, "primary", primary.Name)
	require.EqualValues(t, 1, primary.AttemptsLastMinute)
	require.Equal(t, 1, primary.Samples)
	require.Equal(t, "closed", primary.Breaker)

	require.JSONEq(t, `{"event":"customer.deleted","key":"charge:o-2","removed":0}`,
		s.ok(t, "workflow", "cache", "invalidate", "--event", "customer.deleted", "--key", "charge:o-2"), "another key")
	require.JSONEq(t, `{"event":"customer.deleted","key":"charge:o-1","removed":1}`,
		s.ok(t, "workflow", "cache", "invalidate", "--event", "customer.deleted", "--key", "charge:o-1"))
	require.JSONEq(t, `{"event":"order.refunded","removed":0}`, s.ok(t, "workflow", "cache", "invalidate", "--event", "order.refunded"), "already gone")
}

func TestPrintPlans(t *testing.T) {
	var b strings.Builder
	require.NoError(t, printPlans(&b, &flo.WorkflowPlans{Workflow: "w", Version: "2", Replica: "wf-0", Plans: []flo.PlanStatus{{
		Name: "p", Selection: "static-order", Executors: []flo.ExecutorStatus{
			{Name: "a", Action: "act-a", Priority: 10, Score: 0.035, Samples: 12, APISuccessRate: 0.25, BusinessSuccessRate: 0.5, Breaker: "open", AttemptsLastMinute: 40},
			{Name: "b", Action: "act-b", Score: 1, APISuccessRate: 1, BusinessSuccessRate: 1, Breaker: "none"},
		},
	}}}))
	lines := strings.Split(b.String(), "\n")
	require.Equal(t, "workflow w version 2, as replica wf-0 sees it", lines[0])
	require.Equal(t, "note: "+replicaNote, lines[1])
	require.Equal(t, "plan p (static-order)", lines[3])
	require.Regexp(t, regexp.MustCompile(`^  a\s+act-a\s+10\s+0\.035\s+12\s+0\.250\s+0\.500\s+open\s+40$`), lines[5])
	require.Regexp(t, regexp.MustCompile(`^  b\s+act-b\s+0\s+1\.000\s+0\s+1\.000\s+1\.000\s+none\s+0$`), lines[6], "an executor without a breaker")

	b.Reset()
	require.NoError(t, printPlans(&b, &flo.WorkflowPlans{Workflow: "w", Version: "2", Replica: "wf-0"}))
	require.True(t, strings.HasSuffix(b.String(), "\nno plans\n"), b.String())
}
