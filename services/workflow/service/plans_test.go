package service_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// planLines renders a run's plan_* events as "type executor".
func planLines(evs []*flov1.HistoryEvent) []string {
	var out []string
	for _, ev := range evs {
		if !strings.HasPrefix(ev.GetType(), "plan_") {
			continue
		}
		name := ev.GetDetail()
		if i := strings.IndexAny(name, " :"); i > 0 {
			name = name[:i]
		}
		out = append(out, ev.GetType()+" "+name)
	}
	return out
}

// firstExecutor is the executor a run's plan tried first.
func firstExecutor(t *testing.T, e *env, ns, id string) string {
	t.Helper()
	for _, line := range planLines(e.history(t, ns, id)) {
		if name, ok := strings.CutPrefix(line, "plan_executor_start "); ok {
			return name
		}
	}
	t.Fatalf("run %s started no executor", id)
	return ""
}

const threeExecutorsYAML = `
kind: Workflow
name: %[1]s
version: "1"
plans:
  send:
    selection: %[1]s
%[2]s    executors:
      - {name: low, action: "@actions/send-low", priority: 1}
      - {name: high, action: "@actions/send-high", priority: 10}
      - {name: mid, action: "@actions/send-mid", priority: 5}
start:
  run: "@plan/send"
  transitions: {success: flo.Completed, failure: flo.Failed}
`

// TestPlanSelection checks each selection strategy's order over many runs of
// a three-executor plan.
func TestPlanSelection(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	sequence := func(t *testing.T, ns, workflow string, runs int) []string {
		var firsts []string
		for i := range runs {
			id := e.start(t, ns, workflow, fmt.Sprintf(`{"n": %d}`, i), "")
			e.waitRun(t, ns, id, stCompleted)
			firsts = append(firsts, firstExecutor(t, e, ns, id))
		}
		return firsts
	}
	setup := func(t *testing.T, selection, health string) string {
		ns := e.namespace(t)
		e.worker(t, ns, script{
			"send-low":  func(*flov1.TaskAssignment) reply { return ok(`{"by":"low"}`) },
			"send-high": func(*flov1.TaskAssignment) reply { return ok(`{"by":"high"}`) },
			"send-mid":  func(*flov1.TaskAssignment) reply { return ok(`{"by":"mid"}`) },
		})
		e.create(t, ns, fmt.Sprintf(threeExecutorsYAML, selection, health))
		return ns
	}

	t.Run("static-order", func(t *testing.T) {
		ns := setup(t, "static-order", "")
		require.Equal(t, []string{"high", "high", "high", "high"}, sequence(t, ns, "static-order", 4))
	})
	t.Run("round-robin", func(t *testing.T) {
		ns := setup(t, "round-robin", "")
		firsts := sequence(t, ns, "round-robin", 6)
		require.Equal(t, firsts[:3], firsts[3:], "the rotation repeats: %v", firsts)
		require.ElementsMatch(t, []string{"high", "mid", "low"}, firsts[:3], "each executor starts once per rotation")
	})
	t.Run("random", func(t *testing.T) {
		ns := setup(t, "random", "")
		counts := map[string]int{}
		for _, f := range sequence(t, ns, "random", 45) {
			counts[f]++
		}
		// A fair shuffle misses one of three executors in 45 draws with a
		// chance of about 3e-8.
		require.Len(t, counts, 3, "every executor is tried first sometimes: %v", counts)
	})
	t.Run("health-weighted", func(t *testing.T) {
		health := "    health: {window_ms: 6000, decay: 0.9, min_samples: 2}\n"
		ns := e.namespace(t)
		var highDown atomic.Bool
		highDown.Store(true)
		e.worker(t, ns, script{
			"send-low": func(*flov1.TaskAssignment) reply { return ok(`{"by":"low"}`) },
			"send-high": func(*flov1.TaskAssignment) reply {
				if highDown.Load() {
					return reply{fail: "provider down"}
				}
				return ok(`{"by":"high"}`)
			},
			"send-mid": func(*flov1.TaskAssignment) reply { return ok(`{"by":"mid"}`) },
		})
		e.create(t, ns, fmt.Sprintf(threeExecutorsYAML, "health-weighted", health))

		// Below min_samples an executor scores as healthy, so high
		// (failing) goes first twice and mid serves; with two failures in
		// the window high scores 0.3 and mid goes first.
		require.Equal(t, []string{"high", "high", "mid", "mid"}, sequence(t, ns, "health-weighted", 4))
		// It recovers; once its failures leave the 6 s window (long
		// enough for four runs on a loaded box) it is tried first again.
		highDown.Store(false)
		require.Eventually(t, func() bool {
			return sequence(t, ns, "health-weighted", 1)[0] == "high"
		}, waitFor, 200*time.Millisecond, "health-weighted never came back to the recovered executor")
	})
}

// TestPlanRateLimitAcrossReplicas: an executor limited to 5 attempts a
// second takes at most 5 in any calendar second although two replicas run
// its runs; runs over the limit wait for room and all complete.
func TestPlanRateLimitAcrossReplicas(t *testing.T) {
	t.Parallel()
	const (
		runs  = 30
		limit = 5
	)
	e := startEnv(t)
	second := startWorkflow(t, e.dbURL, e.brokers)
	ns := e.namespace(t)
	e.worker(t, ns, script{"send": func(*flov1.TaskAssignment) reply { return ok(`{}`) }})
	e.create(t, ns, fmt.Sprintf(`
kind: Workflow
name: limited
version: "1"
plans:
  notify:
    executors:
      - name: sms
        action: "@actions/send"
        rate_limit: {max_per_second: %d, max_per_hour: 1000}
start:
  run: "@plan/notify"
  transitions: {success: flo.Completed, failure: flo.Failed}
`, limit))

	ids := make([]string, runs)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() {
			client := e.wf.client
			if i%2 == 1 {
				client = second.client
			}
			resp, err := client.StartRun(t.Context(), &flov1.StartRunRequest{Namespace: ns, Workflow: "limited", Input: []byte(`{}`)})
			if err == nil {
				ids[i] = resp.GetRunId()
			}
		})
	}
	wg.Wait()
	perSecond := map[int64]int{}
	waits := 0
	for i, id := range ids {
		require.NotEmpty(t, id, "start %d failed", i)
		e.waitRun(t, ns, id, stCompleted)
		for _, ev := range e.history(t, ns, id) {
			switch ev.GetType() {
			case "plan_executor_start":
				perSecond[ev.GetAt().AsTime().Unix()]++
			case "plan_rate_wait":
				waits++
			}
		}
	}
	total := 0
	for sec, n := range perSecond {
		require.LessOrEqual(t, n, limit, "second %d had %d attempts", sec, n)
		total += n
	}
	require.Equal(t, runs, total, "one attempt per run")
	require.Positive(t, waits, "runs over the limit waited for room")
	require.GreaterOrEqual(t, len(perSecond), runs/limit, "the attempts spread over at least %d seconds", runs/limit)
}

// TestPlanAsyncTimeout: an async executor whose outcome never comes times out
// after its timeout_ms and the next executor serves; the run showed waiting
// meanwhile.
func TestPlanAsyncTimeout(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	ns := e.namespace(t)
	e.worker(t, ns, script{
		"charge-hosted": func(*flov1.TaskAssignment) reply { return reply{pending: true} },
		"charge-backup": func(*flov1.TaskAssignment) reply { return ok(`{"by":"backup"}`) },
	})
	e.create(t, ns, `
kind: Workflow
name: hosted
version: "1"
plans:
  charge:
    executors:
      - name: hosted
        action: "@actions/charge-hosted"
        priority: 10
        tracking: {mode: async, timeout_ms: 1500}
      - {name: backup, action: "@actions/charge-backup"}
start:
  run: "@plan/charge"
  transitions: {success: flo.Completed, failure: flo.Failed}
`)
	id := e.start(t, ns, "hosted", `{}`, "")
	require.Eventually(t, func() bool {
		return e.run(t, ns, id).GetStatus() == flov1.RunStatus_RUN_STATUS_WAITING
	}, waitFor, tick, "the run never showed waiting for the async executor")
	run := e.waitRun(t, ns, id, stCompleted)
	require.JSONEq(t, `{"by":"backup"}`, string(run.GetOutputs()[0].GetOutput()))
	evs := e.history(t, ns, id)
	require.Equal(t, []string{
		"plan_executor_start hosted", "plan_executor_exhausted hosted",
		"plan_executor_start backup", "plan_executor_success backup",
	}, planLines(evs))
	for _, ev := range evs {
		if ev.GetType() == "plan_executor_exhausted" {
			require.Contains(t, ev.GetDetail(), "no outcome within timeout_ms 1500")
		}
	}
}

// TestPlanRestartMidPlan stops a replica while plans are mid-way (attempts in
// flight, executor retry timers set) and starts another: every run completes,
// each with the same plan history, and no attempt's task ran twice.
func TestPlanRestartMidPlan(t *testing.T) {
	t.Parallel()
	const runs = 60
	e := startEnv(t)
	second := startWorkflow(t, e.dbURL, e.brokers)
	ns := e.namespace(t)
	var (
		mu      sync.Mutex
		perTask = map[string]int{}
		failed  = map[string]bool{}
		handled atomic.Int32
	)
	e.worker(t, ns, script{
		"pay-a": func(task *flov1.TaskAssignment) reply {
			handled.Add(1)
			mu.Lock()
			defer mu.Unlock()
			perTask[task.GetTaskId()]++
			key := string(task.GetPayload())
			if !failed[key] {
				failed[key] = true
				return reply{fail: "provider busy", code: "rate_limited"}
			}
			return ok(`{"by":"a"}`)
		},
		"pay-b": func(*flov1.TaskAssignment) reply { return ok(`{"by":"b"}`) },
	})
	e.create(t, ns, `
kind: Workflow
name: resumable
version: "1"
plans:
  pay:
    executors:
      - name: a
        action: "@actions/pay-a"
        priority: 10
        retry: {max_attempts: 2, backoff: constant, initial_delay_ms: 300}
      - {name: b, action: "@actions/pay-b"}
    errors: {retryable: [rate_limited]}
start:
  run: "@plan/pay"
  transitions: {success: flo.Completed, failure: flo.Failed}
`)
	ids := make([]string, runs)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() {
			client := e.wf.client
			if i%2 == 1 {
				client = second.client
			}
			resp, err := client.StartRun(t.Context(), &flov1.StartRunRequest{Namespace: ns, Workflow: "resumable", Input: fmt.Appendf(nil, `{"n":%d}`, i)})
			if err == nil {
				ids[i] = resp.GetRunId()
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return handled.Load() >= runs/2 }, waitFor, tick, "runs never got going")
	e.wf.stop()
	require.Less(t, int(handled.Load()), 2*runs, "the replica stopped before the plans finished")
	e.wf = startWorkflow(t, e.dbURL, e.brokers)

	for i, id := range ids {
		require.NotEmpty(t, id, "start %d failed", i)
		run := e.waitRun(t, ns, id, stCompleted)
		require.JSONEq(t, `{"by":"a"}`, string(run.GetOutputs()[0].GetOutput()))
		require.Equal(t, []string{
			"plan_executor_start a", "plan_executor_retry a", "plan_executor_start a", "plan_executor_success a",
		}, planLines(e.history(t, ns, id)), "run %s", id)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, perTask, 2*runs, "two attempts per run, each its own task")
	for task, n := range perTask {
		require.Equal(t, 1, n, "task %s ran %d times", task, n)
	}
}

// TestPlanFallback: with condition exhausted the fallback value answers once
// every executor failed; with any_error once the first one did, and the
// others are never called.
func TestPlanFallback(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	ns := e.namespace(t)
	var calls sync.Map
	count := func(action string) int {
		n, _ := calls.Load(action)
		if n == nil {
			return 0
		}
		return n.(int)
	}
	down := func(action string) func(*flov1.TaskAssignment) reply {
		return func(*flov1.TaskAssignment) reply {
			calls.Store(action, count(action)+1)
			return reply{fail: action + " is down"}
		}
	}
	e.worker(t, ns, script{"first": down("first"), "second": down("second")})
	for _, cond := range []string{"exhausted", "any_error"} {
		e.create(t, ns, fmt.Sprintf(`
kind: Workflow
name: fallback-%[1]s
version: "1"
plans:
  p:
    executors:
      - {name: a, action: "@actions/first", priority: 2}
      - {name: b, action: "@actions/second", priority: 1}
    fallback:
      value: '{"status": "declined", "reason": "all_providers_unavailable"}'
      condition: %[1]s
start:
  run: "@plan/p"
  transitions: {success: flo.Completed, failure: flo.Failed}
`, cond))
	}

	id := e.start(t, ns, "fallback-exhausted", `{}`, "")
	run := e.waitRun(t, ns, id, stCompleted)
	require.JSONEq(t, `{"status": "declined", "reason": "all_providers_unavailable"}`, string(run.GetOutputs()[0].GetOutput()))
	require.Equal(t, []string{
		"plan_executor_start a", "plan_executor_exhausted a",
		"plan_executor_start b", "plan_executor_exhausted b",
		"plan_fallback every",
	}, planLines(e.history(t, ns, id)))
	require.Equal(t, 1, count("second"))

	id = e.start(t, ns, "fallback-any_error", `{}`, "")
	run = e.waitRun(t, ns, id, stCompleted)
	require.JSONEq(t, `{"status": "declined", "reason": "all_providers_unavailable"}`, string(run.GetOutputs()[0].GetOutput()))
	require.Equal(t, []string{"plan_executor_start a", "plan_executor_exhausted a", "plan_fallback executor"}, planLines(e.history(t, ns, id)))
	require.Equal(t, 1, count("second"), "any_error: b is never called")
	require.Equal(t, 2, count("first"))
}
