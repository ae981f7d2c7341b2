package service_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func TestRESTWorkerRegistryLifecycle(t *testing.T) {
	s := startRegistryStack(t)

	reg := s.rest(t, http.MethodPost, "/v1/namespaces/default/workers", map[string]any{
		"workerId":       "w-rest",
		"workerType":     "WORKER_TYPE_ACTION",
		"maxConcurrency": 4,
		"processes":      []any{map[string]any{"name": "resize"}, map[string]any{"name": "send-email"}},
		"metadata":       `{"version":"1.2.3"}`,
		"machineId":      "m-1",
	})
	require.Equal(t, http.StatusOK, reg.status, "%s", reg.raw)
	require.Equal(t, "default", reg.body["namespace"])
	require.Equal(t, "w-rest", reg.body["workerId"])
	require.Equal(t, "WORKER_TYPE_ACTION", reg.body["workerType"])
	require.Equal(t, "WORKER_STATUS_ACTIVE", reg.body["status"])
	require.EqualValues(t, 4, reg.body["maxConcurrency"])
	require.Equal(t, "m-1", reg.body["machineId"])
	require.JSONEq(t, `{"version":"1.2.3"}`, reg.body["metadata"].(string))
	require.NotEmpty(t, reg.body["registeredAt"])
	procs := reg.body["processes"].([]any)
	require.Len(t, procs, 2)
	require.Equal(t, "resize", procs[0].(map[string]any)["name"])
	require.Equal(t, "PROCESS_KIND_ACTION", procs[0].(map[string]any)["kind"])

	hb := s.rest(t, http.MethodPost, "/v1/namespaces/default/workers/w-rest/heartbeat", map[string]any{"currentLoad": 3})
	require.Equal(t, http.StatusOK, hb.status, "%s", hb.raw)
	require.Equal(t, "WORKER_STATUS_ACTIVE", hb.body["status"])

	list := s.rest(t, http.MethodGet, "/v1/namespaces/default/workers", nil)
	require.Equal(t, http.StatusOK, list.status, "%s", list.raw)
	workers := list.body["workers"].([]any)
	require.Len(t, workers, 1)
	listed := workers[0].(map[string]any)
	require.Equal(t, "w-rest", listed["workerId"])
	require.EqualValues(t, 3, listed["currentLoad"])
	require.NotEmpty(t, listed["lastHeartbeat"])

	got := s.rest(t, http.MethodGet, "/v1/namespaces/default/workers/w-rest", nil)
	require.Equal(t, http.StatusOK, got.status, "%s", got.raw)
	require.Equal(t, "w-rest", got.body["workerId"])
	require.EqualValues(t, 3, got.body["currentLoad"])

	drain := s.rest(t, http.MethodPost, "/v1/namespaces/default/workers/w-rest/drain", nil)
	require.Equal(t, http.StatusOK, drain.status, "%s", drain.raw)
	require.Equal(t, "WORKER_STATUS_DRAINING", drain.body["status"])

	// Draining is sticky: a heartbeat does not turn it active again.
	hb = s.rest(t, http.MethodPost, "/v1/namespaces/default/workers/w-rest/heartbeat", map[string]any{"currentLoad": 1})
	require.Equal(t, http.StatusOK, hb.status, "%s", hb.raw)
	require.Equal(t, "WORKER_STATUS_DRAINING", hb.body["status"])

	del := s.rest(t, http.MethodDelete, "/v1/namespaces/default/workers/w-rest", nil)
	require.Equal(t, http.StatusOK, del.status, "%s", del.raw)
	require.JSONEq(t, `{}`, string(del.raw))

	gone := s.rest(t, http.MethodGet, "/v1/namespaces/default/workers/w-rest", nil)
	require.Equal(t, http.StatusNotFound, gone.status, "%s", gone.raw)
	require.EqualValues(t, codes.NotFound, gone.body["code"])

	// Deregistering again still succeeds: the outcome the caller wants holds.
	again := s.rest(t, http.MethodDelete, "/v1/namespaces/default/workers/w-rest", nil)
	require.Equal(t, http.StatusOK, again.status, "%s", again.raw)

	empty := s.rest(t, http.MethodGet, "/v1/namespaces/default/workers", nil)
	require.Equal(t, http.StatusOK, empty.status, "%s", empty.raw)
	require.Empty(t, empty.body["workers"])
}

func TestWorkerRegistryBadInput(t *testing.T) {
	s := startRegistryStack(t)
	action := map[string]any{"workerId": "w-ok", "workerType": "WORKER_TYPE_ACTION"}
	with := func(k string, v any) map[string]any {
		out := map[string]any{}
		for key, val := range action {
			out[key] = val
		}
		out[k] = v
		return out
	}
	tests := []struct {
		name   string
		method string
		path   string
		body   any
		status int
		text   string
	}{
		{"unknown namespace", http.MethodPost, "/v1/namespaces/nope/workers", action, http.StatusNotFound, `namespace "nope" not found`},
		{"list in unknown namespace", http.MethodGet, "/v1/namespaces/nope/workers", nil, http.StatusNotFound, `namespace "nope" not found`},
		{"missing worker type", http.MethodPost, "/v1/namespaces/default/workers", map[string]any{"workerId": "w-x"}, http.StatusBadRequest, "worker_type is required"},
		{"unknown worker type", http.MethodPost, "/v1/namespaces/default/workers", with("workerType", "WORKER_TYPE_ROBOT"), http.StatusBadRequest, "WORKER_TYPE_ROBOT"},
		{"malformed metadata", http.MethodPost, "/v1/namespaces/default/workers", with("metadata", "{not json"), http.StatusBadRequest, "metadata is not valid JSON"},
		{"metadata not an object", http.MethodPost, "/v1/namespaces/default/workers", with("metadata", "[1,2]"), http.StatusBadRequest, "metadata must be a JSON object"},
		{"oversized metadata", http.MethodPost, "/v1/namespaces/default/workers", with("metadata", fmt.Sprintf(`{"pad":"%0*d"}`, 17<<10, 0)), http.StatusBadRequest, "metadata is"},
		{"bad worker id", http.MethodPost, "/v1/namespaces/default/workers", with("workerId", "no spaces allowed"), http.StatusBadRequest, "worker_id"},
		{"negative concurrency", http.MethodPost, "/v1/namespaces/default/workers", with("maxConcurrency", -1), http.StatusBadRequest, "max_concurrency"},
		{"unknown field", http.MethodPost, "/v1/namespaces/default/workers", with("colour", "blue"), http.StatusBadRequest, "colour"},
		{"malformed body", http.MethodPost, "/v1/namespaces/default/workers", `{"workerId":`, http.StatusBadRequest, ""},
		{"heartbeat of an unknown worker", http.MethodPost, "/v1/namespaces/default/workers/ghost/heartbeat", map[string]any{"currentLoad": 1}, http.StatusNotFound, "ghost"},
		{"negative load", http.MethodPost, "/v1/namespaces/default/workers/ghost/heartbeat", map[string]any{"currentLoad": -1}, http.StatusBadRequest, "current_load"},
		{"drain an unknown worker", http.MethodPost, "/v1/namespaces/default/workers/ghost/drain", nil, http.StatusNotFound, "ghost"},
		{"get an unknown worker", http.MethodGet, "/v1/namespaces/default/workers/ghost", nil, http.StatusNotFound, "ghost"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := s.rest(t, tc.method, tc.path, tc.body)
			require.Equal(t, tc.status, resp.status, "%s", resp.raw)
			require.NotNil(t, resp.body, "error body: %s", resp.raw)
			require.Contains(t, resp.body["message"], tc.text)
		})
	}
	// None of the refused registrations stored anything.
	list, err := s.registry.ListWorkers(testContext(t), &flov1.ListWorkersRequest{Namespace: "default"})
	require.NoError(t, err)
	require.Empty(t, list.GetWorkers())

	t.Run("gRPC callers get the same codes", func(t *testing.T) {
		_, err := s.registry.ListWorkers(testContext(t), &flov1.ListWorkersRequest{})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		_, err = s.registry.GetWorker(testContext(t), &flov1.GetWorkerRequest{Namespace: "default"})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		_, err = s.registry.DrainWorker(testContext(t), &flov1.GetWorkerRequest{Namespace: "default", WorkerId: "ghost"})
		require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	})

	t.Run("a namespace past its worker limit", func(t *testing.T) {
		created := s.rest(t, http.MethodPost, "/v1/namespaces", map[string]any{"name": "crowd"})
		require.Equal(t, http.StatusOK, created.status, "%s", created.raw)
		for i := range testMaxWorkers {
			r := s.rest(t, http.MethodPost, "/v1/namespaces/crowd/workers", map[string]any{
				"workerId": fmt.Sprintf("w-%d", i), "workerType": "WORKER_TYPE_STREAM",
			})
			require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
		}
		over := s.rest(t, http.MethodPost, "/v1/namespaces/crowd/workers", map[string]any{
			"workerId": "one-too-many", "workerType": "WORKER_TYPE_ACTION",
		})
		require.Equal(t, http.StatusTooManyRequests, over.status, "%s", over.raw)
		require.EqualValues(t, codes.ResourceExhausted, over.body["code"])
		require.Contains(t, over.body["message"], "limit")
		// Re-registering a known id is not a new worker.
		same := s.rest(t, http.MethodPost, "/v1/namespaces/crowd/workers", map[string]any{
			"workerId": "w-0", "workerType": "WORKER_TYPE_ACTION",
		})
		require.Equal(t, http.StatusOK, same.status, "%s", same.raw)
	})
}

// TestDrainReachesTheWorkerStream drains a worker holding two tasks through
// REST: its stream gets a Drain message and no task after it, the held tasks
// still complete, and tasks invoked later go to another worker, none of them
// having counted an attempt on the drained one.
func TestDrainReachesTheWorkerStream(t *testing.T) {
	s := startRegistryStack(t)
	reg := s.rest(t, http.MethodPost, "/v1/namespaces/default/workers", map[string]any{
		"workerId": "w-drain", "workerType": "WORKER_TYPE_ACTION", "maxConcurrency": 10,
	})
	require.Equal(t, http.StatusOK, reg.status, "%s", reg.raw)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w-drain", Namespace: "default", Actions: []string{"job"}, MaxConcurrency: 10})

	first := []string{invoke(t, s, "job", `{"n":1}`), invoke(t, s, "job", `{"n":2}`)}
	w.ready(t, 10, 600_000)
	held := w.tasks(t, 2)
	require.ElementsMatch(t, first, []string{held[0].GetTaskId(), held[1].GetTaskId()})

	drain := s.rest(t, http.MethodPost, "/v1/namespaces/default/workers/w-drain/drain", nil)
	require.Equal(t, http.StatusOK, drain.status, "%s", drain.raw)
	require.Equal(t, "WORKER_STATUS_DRAINING", drain.body["status"])
	m := w.next(t)
	require.NotNil(t, m.GetDrain(), "expected Drain, got %v", m)

	// The drained worker still has credit for 8 and asks for more: it gets
	// nothing. Its reports still go through.
	later := map[string]bool{}
	for i := range 3 {
		later[invoke(t, s, "job", fmt.Sprintf(`{"later":%d}`, i))] = true
	}
	w.ready(t, 5, 600_000)
	for _, task := range held {
		w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(task.GetTaskId(), task.GetAttempt(), `"done"`)}})
	}
	for _, id := range first {
		awaitStatus(t, s, id, flov1.TaskStatus_TASK_STATUS_COMPLETED)
	}

	other := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w-other", Namespace: "default", Actions: []string{"job"}})
	other.ready(t, 10, 600_000)
	for _, task := range other.tasks(t, 3) {
		require.True(t, later[task.GetTaskId()], "unexpected task %s", task.GetTaskId())
		require.EqualValues(t, 1, task.GetAttempt(), "a task given back by the drained stream counted no attempt")
	}
	for len(w.msgs) > 0 {
		m := <-w.msgs
		require.Empty(t, m.GetTaskBatch().GetTasks(), "a task reached the worker after its Drain: %v", m)
	}
}

// TestStreamOfADrainedWorkerIsDrainedAtOnce opens a stream for a worker the
// registry already has draining: the gateway asks the registry and sends
// Drain without waiting for an event.
func TestStreamOfADrainedWorkerIsDrainedAtOnce(t *testing.T) {
	s := startRegistryStack(t)
	ctx := testContext(t)
	_, err := s.registry.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{
		Namespace: "default", WorkerId: "w-late", WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION,
	})
	require.NoError(t, err)
	drained, err := s.registry.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: "default", WorkerId: "w-late"})
	require.NoError(t, err)
	require.Equal(t, flov1.WorkerStatus_WORKER_STATUS_DRAINING, drained.GetStatus())

	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w-late", Namespace: "default", Actions: []string{"job"}})
	m := w.next(t)
	require.NotNil(t, m.GetDrain(), "expected Drain, got %v", m)
}

// TestMaxConcurrencyCapsHeldTasks asks for more tasks than the Hello's
// max_concurrency: the stream holds at most that many, and a report frees
// room for the next.
func TestMaxConcurrencyCapsHeldTasks(t *testing.T) {
	s := startStack(t)
	capped := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "capped", Namespace: "default", Actions: []string{"job"}, MaxConcurrency: 2})
	ids := map[string]bool{}
	for i := range 5 {
		ids[invoke(t, s, "job", fmt.Sprintf(`{"n":%d}`, i))] = true
	}
	capped.ready(t, 5, 600_000)
	held := capped.tasks(t, 2)

	// The other three are left for someone else: a second worker gets
	// exactly them, so the capped one never had them.
	other := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "other", Namespace: "default", Actions: []string{"job"}})
	other.ready(t, 3, 600_000)
	for _, task := range append(held, other.tasks(t, 3)...) {
		require.True(t, ids[task.GetTaskId()])
		delete(ids, task.GetTaskId())
	}
	require.Empty(t, ids)
	require.Empty(t, capped.msgs, "the capped worker got more than its max_concurrency")

	// Reporting one frees one place: the capped stream's remaining credit
	// takes the next task.
	next := invoke(t, s, "job", `{"n":"next"}`)
	capped.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(held[0].GetTaskId(), held[0].GetAttempt(), `"ok"`)}})
	got := capped.tasks(t, 1)
	require.Equal(t, next, got[0].GetTaskId())
}

// TestRegistryDownLeavesTheTaskPathUp runs a gateway whose registry is not
// there: worker-registry calls fail with Unavailable, while readiness and a
// worker stream carry on.
func TestRegistryDownLeavesTheTaskPathUp(t *testing.T) {
	s := startStack(t)
	require.True(t, s.gateway.Ready())

	list := s.rest(t, http.MethodGet, "/v1/namespaces/default/workers", nil)
	require.Equal(t, http.StatusServiceUnavailable, list.status, "%s", list.raw)
	require.EqualValues(t, codes.Unavailable, list.body["code"])
	_, err := s.registry.RegisterWorker(testContext(t), &flov1.RegisterWorkerRequest{
		Namespace: "default", WorkerId: "w", WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION,
	})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	readyz := s.rest(t, http.MethodGet, "/readyz", nil)
	require.Equal(t, http.StatusOK, readyz.status)

	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w", Namespace: "default", Actions: []string{"job"}, MaxConcurrency: 1})
	id := invoke(t, s, "job", `{}`)
	w.ready(t, 1, 600_000)
	task := w.tasks(t, 1)[0]
	require.Equal(t, id, task.GetTaskId())
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(id, task.GetAttempt(), `"ok"`)}})
	awaitStatus(t, s, id, flov1.TaskStatus_TASK_STATUS_COMPLETED)
}

// TestDrainThroughAnotherReplicaArrivesAsAnEvent drains a worker at the
// registry directly, as another gateway replica would: this gateway learns it
// from the worker event on the log and drains the stream.
func TestDrainThroughAnotherReplicaArrivesAsAnEvent(t *testing.T) {
	s := startRegistryStack(t)
	ctx := testContext(t)
	direct := registryv1.NewRegistryClient(dialInternal(t, s.registryAddr))
	_, err := direct.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{
		Namespace: "default", WorkerId: "w-event", WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION,
	})
	require.NoError(t, err)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w-event", Namespace: "default", Actions: []string{"job"}})
	w.ready(t, 5, 600_000)

	_, err = direct.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: "default", WorkerId: "w-event"})
	require.NoError(t, err)
	m := w.next(t)
	require.NotNil(t, m.GetDrain(), "expected Drain, got %v", m)

	id := invoke(t, s, "job", `{}`)
	other := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w-other", Namespace: "default", Actions: []string{"job"}})
	other.ready(t, 1, 600_000)
	got := other.tasks(t, 1)[0]
	require.Equal(t, id, got.GetTaskId())
	require.EqualValues(t, 1, got.GetAttempt())
	require.Empty(t, w.msgs)
}
