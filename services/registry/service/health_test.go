package service_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/registry/service"
)

// TestHealth runs two replicas on one database with a short heartbeat
// timeout, both running the health check.
func TestHealth(t *testing.T) {
	e := startEnv(t, func(c *service.Config) {
		c.HeartbeatTimeout = 300 * time.Millisecond
		c.HealthCheckInterval = 20 * time.Millisecond
		c.MaxWorkersPerNamespace = 100
	})
	other := startReplica(t, e.cfg)
	t.Run("unhealthy and back", func(t *testing.T) { t.Parallel(); testUnhealthyAndBack(t, e, other) })
	t.Run("draining is never unhealthy", func(t *testing.T) { t.Parallel(); testDrainingStays(t, e) })
	t.Run("one change per worker across replicas", func(t *testing.T) { t.Parallel(); testReplicasAgree(t, e, other) })
}

func testUnhealthyAndBack(t *testing.T, e *env, other *replica) {
	ns := namespace()
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "w"})
	waitStatus(t, e.client, ns, "w", stUnhealthy)
	// Kept, not removed, and seen alike through either replica.
	require.Equal(t, stUnhealthy, getWorker(t, other.client, ns, "w").GetStatus())

	require.Equal(t, stActive, heartbeat(t, other.client, ns, "w", 1), "a heartbeat brings it back")
	e.events.waitEventsPrefix(t, ns, "w",
		change{evRegistered, stNone, stActive},
		change{evChanged, stActive, stUnhealthy},
		change{evChanged, stUnhealthy, stActive},
	)
}

func testDrainingStays(t *testing.T, e *env) {
	ctx := t.Context()
	ns := namespace()
	// d's last heartbeat is older than w's, so by the time w is unhealthy
	// d has been silent past the timeout too.
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "d"})
	_, err := e.client.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: "d"})
	require.NoError(t, err)
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "w"})
	waitStatus(t, e.client, ns, "w", stUnhealthy)
	require.Equal(t, stDraining, getWorker(t, e.client, ns, "d").GetStatus())
	require.Equal(t, stDraining, heartbeat(t, e.client, ns, "d", 0))
}

func testReplicasAgree(t *testing.T, e *env, other *replica) {
	ctx := t.Context()
	ns := namespace()
	const n = 40
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("w%02d", i)
		c := e.client
		if i%2 == 1 {
			c = other.client
		}
		register(t, c, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: ids[i]})
	}
	require.Eventually(t, func() bool {
		for _, c := range []*replica{e.replica, other} {
			list, err := c.client.ListWorkers(ctx, &flov1.ListWorkersRequest{Namespace: ns})
			require.NoError(t, err)
			for _, w := range list.GetWorkers() {
				if w.GetStatus() != stUnhealthy {
					return false
				}
			}
		}
		return true
	}, waitFor, tick, "not every worker turned unhealthy")
	// Draining (which the health check leaves alone) puts a last event
	// behind each worker's unhealthy one, so once it arrives the worker's
	// whole history is in, and it must hold exactly one unhealthy change.
	for _, id := range ids {
		_, err := other.client.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: ns, WorkerId: id})
		require.NoError(t, err)
	}
	for _, id := range ids {
		e.events.waitEvents(t, ns, id,
			change{evRegistered, stNone, stActive},
			change{evChanged, stActive, stUnhealthy},
			change{evChanged, stUnhealthy, stDraining},
		)
	}
}

// TestRestart stops the registry and starts it again on the same database
// and broker: records survive and workers keep heartbeating.
func TestRestart(t *testing.T) {
	e := startEnv(t, nil)
	ns := namespace()
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "w", Metadata: `{"k":"v"}`, Processes: []*flov1.WorkerProcess{{Name: "a"}}})
	require.Equal(t, stActive, heartbeat(t, e.client, ns, "w", 1))
	e.stop()

	again := startReplica(t, e.cfg)
	w := getWorker(t, again.client, ns, "w")
	require.Equal(t, stActive, w.GetStatus())
	require.Equal(t, int32(1), w.GetCurrentLoad())
	require.JSONEq(t, `{"k":"v"}`, w.GetMetadata())
	require.Len(t, w.GetProcesses(), 1)
	require.Equal(t, stIdle, heartbeat(t, again.client, ns, "w", 0))
	_, err := again.client.DrainWorker(t.Context(), &flov1.GetWorkerRequest{Namespace: ns, WorkerId: "w"})
	require.NoError(t, err)
	e.events.waitEvents(t, ns, "w",
		change{evRegistered, stNone, stActive},
		change{evChanged, stActive, stIdle},
		change{evChanged, stIdle, stDraining},
	)
}
