package service_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
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
		served := waitingClaim(t, e, metrics, ns, action)
		id := e.invoke(t, ns, action, `{}`)
		served(id)
		evs := e.events.waitEvents(t, id, evCreated, evStarted)
		require.Equal(t, evs[0].GetOccurredAt().AsTime(), evs[1].GetOccurredAt().AsTime(),
			"created and leased in one batch")
		require.Eventually(t, func() bool { return waitingClaims(metrics) == 0 }, waitFor, tick)
	}
}

// So does a dead letter requeued in a partition rebuilt since it died, which
// held nothing of its queue.
func TestAWaitingClaimGetsARequeuedDeadLetterAtOnce(t *testing.T) {
	// Not parallel: the gauge is read through the global meter provider.
	metrics := telemetrytest.Global(t)
	broker := harness.NewBroker(t)
	cfg := boundedConfig(t, broker)
	e, ns, stop := startBounded(t, cfg, broker)
	e.events = newEventLog()
	e.events.start(t, broker.Addrs())
	e.register(t, ns, "once", &flov1.RegisterActionRequest{MaxAttempts: 1})
	id := e.invoke(t, ns, "once", `{}`)
	a := e.claimOne(t, ns, "once", time.Minute)
	require.Empty(t, e.report(t, ns, failed(a, "boom", true, false)))
	e.events.waitEvents(t, id, evCreated, evStarted, evDead)

	stop()
	svc, _ := startService(t, cfg)
	e.svc, e.client = svc, dispatcherv1.NewDispatcherClient(harness.DialInternal(t, svc.GRPCAddr()))
	served := waitingClaim(t, e, metrics, ns, "once")
	_, err := e.client.RequeueDeadLetter(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: id})
	require.NoError(t, err)
	served(id)
	evs := e.events.waitEvents(t, id, evCreated, evStarted, evDead, evRequeued, evStarted)
	require.Equal(t, evs[3].GetOccurredAt().AsTime(), evs[4].GetOccurredAt().AsTime(), "requeued and leased in one batch")
}

// waitingClaim starts a claim of one task of action that waits, and returns
// once the replica counts it waiting. served then checks that it was
// answered with the task id.
func waitingClaim(t *testing.T, e *env, metrics *telemetrytest.Reader, ns, action string) (served func(id string)) {
	t.Helper()
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
	return func(id string) {
		t.Helper()
		select {
		case tasks := <-got:
			require.Len(t, tasks, 1)
			require.Equal(t, id, tasks[0].GetTaskId())
		case <-time.After(waitFor):
			t.Fatal("waiting claim was not served")
		}
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
