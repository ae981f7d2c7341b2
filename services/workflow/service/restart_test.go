package service_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestRestartMidRun runs hundreds of three-step runs on two workflow
// replicas, stops one while runs are mid-way (tasks in flight, retry timers
// set) and starts a fresh one on the same database and broker: every run
// completes, and each run's history shows each transition exactly once.
func TestRestartMidRun(t *testing.T) {
	t.Parallel()
	const runs = 200
	e := startEnv(t)
	second := startWorkflow(t, e.dbURL, e.brokers)
	ns := e.namespace(t)

	var (
		handled  atomic.Int32
		mu       sync.Mutex
		failedB  = map[string]bool{}
		bAttempt = map[string]int{}
	)
	e.worker(t, ns, script{
		"step-a": func(*flov1.TaskAssignment) reply { handled.Add(1); return ok(`{"a":1}`) },
		"step-b": func(task *flov1.TaskAssignment) reply {
			handled.Add(1)
			mu.Lock()
			defer mu.Unlock()
			// Each run's step b fails its first attempt, so retry timers
			// are pending when the replica stops.
			key := string(task.GetPayload())
			bAttempt[key]++
			if !failedB[key] {
				failedB[key] = true
				return reply{fail: "transient", retry: true}
			}
			return ok(`{"b":1}`)
		},
		"step-c": func(*flov1.TaskAssignment) reply { handled.Add(1); return ok(`{"c":1}`) },
	})
	e.create(t, ns, fmt.Sprintf(threeStepYAML, "restart"))

	ids := make([]string, runs)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() {
			client := e.wf.client
			if i%2 == 1 {
				client = second.client
			}
			resp, err := client.StartRun(t.Context(), &flov1.StartRunRequest{
				Namespace: ns, Workflow: "restart", Input: fmt.Appendf(nil, `{"n":%d}`, i),
			})
			if err == nil {
				ids[i] = resp.GetRunId()
			}
		})
	}
	wg.Wait()
	for i, id := range ids {
		require.NotEmpty(t, id, "start %d failed", i)
	}

	require.Eventually(t, func() bool { return handled.Load() >= runs }, waitFor, tick, "runs never got going")
	e.wf.stop()
	require.Less(t, int(handled.Load()), 4*runs, "the replica stopped before the runs finished")
	third := startWorkflow(t, e.dbURL, e.brokers)
	e.wf = third

	require.Eventually(t, func() bool {
		resp, err := second.client.ListRuns(t.Context(), &flov1.ListRunsRequest{
			Namespace: ns, Workflow: "restart", Status: stCompleted, Limit: 1000,
		})
		require.NoError(t, err)
		return len(resp.GetRuns()) == runs
	}, waitFor, tick, "not every run completed")

	want := []string{
		"workflow_started ",
		"step_started _start", "awaiting_action _start", "action_completed _start", "step_completed _start",
		"step_started b", "awaiting_action b", "action_completed b", "step_retry b",
		"awaiting_action b", "action_completed b", "step_completed b",
		"step_started c", "awaiting_action c", "action_completed c", "step_completed c",
		"workflow_completed c",
	}
	for _, id := range ids {
		require.Equal(t, want, historyTypes(e.history(t, ns, id)), "history of run %s", id)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, bAttempt, runs)
	for key, n := range bAttempt {
		require.Equal(t, 2, n, "step b of %s ran once per attempt", key)
	}
}
