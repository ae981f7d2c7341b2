package service_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/razorbill/flo/libs/harness"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/service"
)

// waitsForGoYAML is a workflow (version %d) whose run waits for a "go" signal.
const waitsForGoYAML = `kind: Workflow
name: waits
version: "%d"
start:
  waitForSignal: {type: go}
  transitions: {success: flo.Completed}
`

// race runs n calls at once and returns their errors by index.
func race(n int, call func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = call(i)
		}()
	}
	wg.Wait()
	return errs
}

// admitted counts the nil errors and requires every other one to be the
// quota's RESOURCE_EXHAUSTED naming msg.
func admitted(t *testing.T, errs []error, msg string) int {
	t.Helper()
	n := 0
	for _, err := range errs {
		if err == nil {
			n++
			continue
		}
		requireCode(t, codes.ResourceExhausted, err, msg)
	}
	return n
}

// TestNamespaceQuotas: workflow versions and signals no step has taken are
// limited per namespace, exactly under concurrency; other namespaces keep
// their own room, a signal a run waits for needs none, and the signals of a
// run that ended stop counting.
func TestNamespaceQuotas(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	e := &env{dbURL: harness.NewDatabase(t), brokers: broker.Addrs()}
	e.dispatcher = startDispatcher(t, e.dbURL, e.brokers)
	e.wf = startWorkflow(t, e.dbURL, e.brokers, func(c *service.Config) {
		c.MaxWorkflowVersionsPerNamespace = 3
		c.MaxPendingSignalsPerNamespace = 2
	})
	ns, other := e.namespace(t), e.namespace(t)

	errs := race(5, func(i int) error {
		_, err := e.client().CreateWorkflow(t.Context(), &flov1.CreateWorkflowRequest{Namespace: ns, Yaml: fmt.Sprintf(waitsForGoYAML, i+1)})
		return err
	})
	require.Equal(t, 3, admitted(t, errs, "the limit is 3 (FLO_MAX_WORKFLOW_VERSIONS_PER_NAMESPACE)"))
	for i := range 3 {
		e.create(t, other, fmt.Sprintf(waitsForGoYAML, i+1))
	}

	runs := []string{e.start(t, ns, "waits", `{}`, ""), e.start(t, ns, "waits", `{}`, ""), e.start(t, ns, "waits", `{}`, "")}
	for _, id := range runs {
		e.waitWaiting(t, ns, id)
	}
	signal := func(id, typ string) error {
		_, err := e.client().SignalRun(t.Context(), &flov1.SignalRunRequest{Namespace: ns, RunId: id, Type: typ, Payload: []byte(`{}`)})
		return err
	}
	// Four signals no step waits for, on two runs at once: two places.
	errs = race(4, func(i int) error { return signal(runs[i%2], "later") })
	require.Equal(t, 2, admitted(t, errs, "the limit is 2 (FLO_MAX_PENDING_SIGNALS_PER_NAMESPACE)"))
	requireCode(t, codes.ResourceExhausted, signal(runs[2], "later"), "has 2 signals no step has taken")

	// The signal a run waits for is taken at once: the run completes.
	require.NoError(t, signal(runs[2], "go"))
	e.waitRun(t, ns, runs[2], flov1.RunStatus_RUN_STATUS_COMPLETED)

	// Ending the runs that hold the backlog frees its places.
	for _, id := range runs[:2] {
		_, err := e.client().CancelRun(t.Context(), &flov1.CancelRunRequest{Namespace: ns, RunId: id})
		require.NoError(t, err)
		e.waitRun(t, ns, id, flov1.RunStatus_RUN_STATUS_CANCELLED)
	}
	again := e.start(t, ns, "waits", `{}`, "")
	e.waitWaiting(t, ns, again)
	require.NoError(t, signal(again, "later"))
}
