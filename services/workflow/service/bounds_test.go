package service_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// runawayYAML's report step would copy the run's input 20,000 times: about
// 20 MB from a 1 KiB input, far past the 64 KiB payload limit of the test
// service. The start step's transitions handle the failure.
var runawayYAML = `kind: Workflow
name: runaway
version: "1"
start:
  run: "@actions/prepare"
  transitions:
    success: report
steps:
  report:
    run: "@actions/report"
    inputMapping: '[` + strings.Repeat(`"$.input",`, 20_000) + `"$.input"]'
    transitions:
      success: flo.Completed
      execution_failure: cleanup
  cleanup:
    run: "@actions/cleanup"
    transitions:
      success: flo.Failed
`

// A mapping that would expand past the payload limit fails its step with
// the mapping error in the run's history; the run follows the step's
// transition, and the service goes on running other runs.
func TestRunawayMappingFailsItsStep(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	ns := e.namespace(t)
	e.worker(t, ns, script{
		"prepare": func(*flov1.TaskAssignment) reply { return ok(`{}`) },
		"report":  func(*flov1.TaskAssignment) reply { return ok(`{}`) },
		"cleanup": func(*flov1.TaskAssignment) reply { return ok(`{"cleaned":true}`) },
	})
	e.create(t, ns, runawayYAML)
	input := fmt.Sprintf(`{"blob":%q}`, strings.Repeat("x", 1024))
	id := e.start(t, ns, "runaway", input, "")

	run := e.waitRun(t, ns, id, stFailed)
	outputs := run.GetOutputs()
	require.Len(t, outputs, 3, "prepare, report, cleanup")
	require.Equal(t, "report", outputs[1].GetStep())
	require.Equal(t, "execution_failure", outputs[1].GetOutcome())
	require.Equal(t, "cleanup", outputs[2].GetStep(), "the failure took the step's transition")

	const problem = `step "report": inputMapping path "$.input": makes the input grow past the payload limit of 65536 bytes`
	var recorded bool
	for _, ev := range e.history(t, ns, id) {
		if ev.GetStep() == "report" && ev.GetType() == "step_completed" {
			require.Contains(t, ev.GetDetail(), problem)
			recorded = true
		}
	}
	require.True(t, recorded, "the mapping error is in the history")

	// The same service runs the next runs to their end.
	e.create(t, ns, `kind: Workflow
name: ordinary
version: "1"
start:
  run: "@actions/prepare"
  transitions:
    success: flo.Completed
`)
	for range 3 {
		e.waitRun(t, ns, e.start(t, ns, "ordinary", `{}`, ""), stCompleted)
	}
}

// A run's backlog of signals no step has taken is bounded in count and in
// bytes: a signal past it is refused and stores nothing, while the signal
// the run waits for is still taken.
func TestSignalBacklogIsBounded(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	ns := e.namespace(t)
	e.create(t, ns, `kind: Workflow
name: backlog
version: "1"
start:
  waitForSignal:
    type: go
  transitions:
    success: flo.Completed
`)
	signal := func(id, typ, payload string) error {
		_, err := e.client().SignalRun(t.Context(), &flov1.SignalRunRequest{Namespace: ns, RunId: id, Type: typ, Payload: []byte(payload)})
		return err
	}

	bySize := e.start(t, ns, "backlog", `{}`, "")
	e.waitWaiting(t, ns, bySize)
	big := fmt.Sprintf("%q", strings.Repeat("x", 60<<10))
	for range 4 {
		require.NoError(t, signal(bySize, "later", big))
	}
	requireCode(t, codes.ResourceExhausted, signal(bySize, "later", big), "more than the limit of 262144")

	byCount := e.start(t, ns, "backlog", `{}`, "")
	e.waitWaiting(t, ns, byCount)
	for range 100 {
		require.NoError(t, signal(byCount, "later", `{}`))
	}
	requireCode(t, codes.ResourceExhausted, signal(byCount, "later", `{}`), "holds 100 signals no step has taken")

	for _, id := range []string{bySize, byCount} {
		require.NoError(t, signal(id, "go", `{"went":true}`))
		e.waitRun(t, ns, id, stCompleted)
	}
}
