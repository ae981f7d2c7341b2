package service_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/service"
)

// nearLimitYAML hands the run's input to its first step and that step's
// result, whole, to the second.
const nearLimitYAML = `kind: Workflow
name: near-limit
version: "1"
start:
  run: "@actions/echo-big"
  transitions:
    success: take
    failure: flo.Failed
steps:
  take:
    run: "@actions/take-big"
    inputMapping: '{"from_start": "$.steps._start.output"}'
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// A run input and a step result just under the default payload limit make
// records past 1 MiB (the InvokeTask commands, the COMPLETED task event that
// carries the result), which every producer is sized for: the run
// completes.
func TestPayloadsNearTheLimitCompleteTheRun(t *testing.T) {
	t.Parallel()
	const limit = config.DefaultMaxPayloadBytes
	broker := harness.NewBroker(t)
	e := &env{dbURL: harness.NewDatabase(t), brokers: broker.Addrs()}
	e.dispatcher = startDispatcher(t, e.dbURL, e.brokers)
	e.wf = startWorkflow(t, e.dbURL, e.brokers, func(c *service.Config) { c.MaxPayloadBytes = limit })

	// 16 bytes under the limit, so the next step's input, which wraps it,
	// is just under it too.
	near := `"` + strings.Repeat("x", limit-16-2) + `"`
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	record := func(task *flov1.TaskAssignment) {
		mu.Lock()
		defer mu.Unlock()
		seen[task.GetAction()] = len(task.GetPayload())
	}
	ns := e.namespace(t)
	e.worker(t, ns, script{
		"echo-big": func(task *flov1.TaskAssignment) reply { record(task); return ok(near) },
		"take-big": func(task *flov1.TaskAssignment) reply { record(task); return ok(`{"took":true}`) },
	})
	e.create(t, ns, nearLimitYAML)
	id := e.start(t, ns, "near-limit", near, "")

	// A run with two payloads near the limit is larger than gRPC's default
	// 4 MiB answer: its input and outputs come raw and as JSON values.
	big := grpc.MaxCallRecvMsgSize(64 << 20)
	var run *flov1.WorkflowRun
	require.Eventually(t, func() bool {
		var err error
		run, err = e.client().GetRun(t.Context(), &flov1.GetRunRequest{Namespace: ns, RunId: id}, big)
		require.NoError(t, err)
		return isEnded(run.GetStatus())
	}, waitFor, tick)
	require.Equal(t, stCompleted, run.GetStatus(), "error %q", run.GetError())
	require.Len(t, run.GetOutputs(), 2)
	require.Len(t, run.GetOutputs()[0].GetOutput(), len(near), "the result reached the run whole")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, len(near), seen["echo-big"], "the run's input reached the step whole")
	require.Equal(t, len(`{"from_start":}`)+len(near), seen["take-big"])
}
