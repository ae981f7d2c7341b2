package devstack_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
)

// heartbeatCalls reads the registry's Heartbeats calls so far and the heartbeats they
// carried (flo_registry_heartbeat_call_size), and the heartbeats recorded by either way.
func heartbeatCalls(t *testing.T, e *env) (calls, carried, recorded float64) {
	t.Helper()
	s := scrapeMetrics(t, e.stack.GatewayMetricsAddr())
	if f := s["flo_registry_heartbeat_call_size"]; f != nil {
		for _, m := range f.GetMetric() {
			calls += float64(m.GetHistogram().GetSampleCount())
			carried += m.GetHistogram().GetSampleSum()
		}
	}
	recorded, _ = s.value("flo_registry_heartbeats_total")
	return calls, carried, recorded
}

// TestStreamHeartbeatsAreBatched runs 100 SDK workers heartbeating every 100 ms: their
// heartbeats go on their worker streams and reach the registry as a few Heartbeats calls of
// many heartbeats each, not one call per heartbeat; every worker's record shows its heartbeat
// and load; a worker whose record was removed registers again from its heartbeat's answer.
func TestStreamHeartbeatsAreBatched(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const n = 100
	opts := func(id string) flo.ActionWorkerOptions {
		return flo.ActionWorkerOptions{WorkerID: id, Concurrency: 1, HeartbeatInterval: 100 * time.Millisecond}
	}
	// Four connections, as a few processes would hold.
	clients := make([]*flo.Client, 4)
	for i := range clients {
		clients[i] = e.client(t, "default")
	}
	running := make(chan struct{})
	release := make(chan struct{})
	for i := range n {
		w, err := clients[i%len(clients)].NewActionWorker(opts(fmt.Sprintf("hb-%03d", i)))
		require.NoError(t, err)
		if i == 0 {
			w.MustRegisterAction("hold", func(*flo.ActionContext) ([]byte, error) {
				close(running)
				<-release
				return nil, nil
			})
		} else {
			w.MustRegisterAction("idle", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Start(wctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("a worker did not stop")
			}
		})
	}
	t.Cleanup(func() { close(release) }) // before the workers stop
	client := clients[0]
	require.Eventually(t, func() bool {
		_, err := client.GetAction(ctx, "hold")
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the worker never made its action known")
	_, err := client.Invoke(ctx, "hold", map[string]string{})
	require.NoError(t, err)
	<-running

	// Every record shows a heartbeat after its registration, and hb-000 its running handler.
	require.Eventually(t, func() bool {
		ws := workers(t, client)
		if len(ws) != n || ws["hb-000"].CurrentLoad != 1 {
			return false
		}
		for _, w := range ws {
			if !w.LastHeartbeat.After(w.RegisteredAt) {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "not every worker's heartbeat was recorded")

	// Over ten rounds of heartbeats, calls carry many each, and the heartbeats recorded are
	// the ones the calls carried (the unary heartbeats would add as many again); n allows for
	// the heartbeats in flight as the window opens.
	calls0, carried0, recorded0 := heartbeatCalls(t, e)
	var calls, carried, recorded float64
	require.Eventually(t, func() bool {
		calls, carried, recorded = heartbeatCalls(t, e)
		return carried-carried0 >= 10*n
	}, 30*time.Second, 50*time.Millisecond, "heartbeats stopped reaching the registry")
	calls, carried, recorded = calls-calls0, carried-carried0, recorded-recorded0
	require.LessOrEqual(t, calls*5, carried, "%v heartbeats took %v Heartbeats calls", carried, calls)
	require.LessOrEqual(t, recorded, carried+n, "heartbeats went past the stream: %v recorded, %v carried", recorded, carried)
	t.Logf("%v heartbeats in %v Heartbeats calls", carried, calls)

	// A removed record comes back: the next heartbeat is answered unknown and the worker
	// registers again.
	require.NoError(t, client.DeregisterWorker(ctx, "hb-007"))
	require.Eventually(t, func() bool {
		w := workers(t, client)["hb-007"]
		return w != nil && w.Status == flo.WorkerIdle
	}, 30*time.Second, 20*time.Millisecond, "the removed worker did not register again")
}
