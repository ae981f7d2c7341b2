package service_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/telemetry/telemetrytest"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// A claim waiting when the first task of a queue arrives in a partition
// that has never seen that queue gets it in the batch that creates it: one
// transaction, one instant for both events. Before, a partition knew the
// queue only after that batch, so such a task waited for the partition's
// next batch: about two seconds on an idle platform, for the first task of
// every new action in every partition.
func TestAWaitingClaimGetsTheFirstTaskOfANewQueueAtOnce(t *testing.T) {
	// Not parallel: the gauge is read through the global meter provider.
	metrics := telemetrytest.Global(t)
	e := startEnv(t)
	ns := e.namespace(t)
	for round := range 3 {
		action := "fresh-" + string(rune('a'+round))
		e.register(t, ns, action, nil)
		got := make(chan []*flov1.TaskAssignment, 1)
		go func() {
			resp, err := e.client.Claim(t.Context(), &dispatcherv1.ClaimRequest{Namespace: ns,
				Slots: []*dispatcherv1.ClaimSlot{{WorkerId: "w1", Count: 1}}, Actions: []string{action}, WaitMs: waitFor.Milliseconds()})
			if err != nil {
				t.Errorf("waiting claim: %v", err)
			}
			got <- resp.GetTasks()
		}()
		require.Eventually(t, func() bool { return waitingClaims(metrics) == 1 }, waitFor, tick, "the claim waits")

		id := e.invoke(t, ns, action, `{}`)
		var tasks []*flov1.TaskAssignment
		select {
		case tasks = <-got:
		case <-time.After(waitFor):
			t.Fatal("waiting claim was not served")
		}
		require.Len(t, tasks, 1)
		require.Equal(t, id, tasks[0].GetTaskId())
		evs := e.events.waitEvents(t, id, evCreated, evStarted)
		require.Equal(t, evs[0].GetOccurredAt().AsTime(), evs[1].GetOccurredAt().AsTime(),
			"created and leased in one batch")
		require.Eventually(t, func() bool { return waitingClaims(metrics) == 0 }, waitFor, tick)
	}
}

// waitingClaims reads flo.dispatcher.claims.waiting.
func waitingClaims(m *telemetrytest.Reader) float64 {
	n := 0.0
	for k, v := range m.Series() {
		if strings.HasPrefix(k, "flo.dispatcher.claims.waiting") {
			n += v
		}
	}
	return n
}
