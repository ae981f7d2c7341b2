package service_test

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func TestRESTActionAndTaskLifecycle(t *testing.T) {
	s := startStack(t)

	reg := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions", map[string]any{
		"name":        "greet",
		"timeoutMs":   10_000,
		"maxAttempts": 2,
		"backoff":     map[string]any{"kind": "BACKOFF_KIND_CONSTANT", "initialDelayMs": 100},
	})
	require.Equal(t, http.StatusOK, reg.status, "%s", reg.raw)
	require.Equal(t, "greet", reg.body["name"])
	require.EqualValues(t, 2, reg.body["maxAttempts"])
	require.Equal(t, true, reg.body["enabled"])

	got := s.rest(t, http.MethodGet, "/v1/namespaces/default/actions/greet", nil)
	require.Equal(t, http.StatusOK, got.status, "%s", got.raw)
	require.Equal(t, "BACKOFF_KIND_CONSTANT", got.body["backoff"].(map[string]any)["kind"])

	list := s.rest(t, http.MethodGet, "/v1/namespaces/default/actions", nil)
	require.Equal(t, http.StatusOK, list.status)
	require.Len(t, list.body["actions"], 1)

	inv := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions/greet/invoke", map[string]any{
		"input":          map[string]any{"name": "Ada <3"},
		"idempotencyKey": "greet-ada",
	})
	require.Equal(t, http.StatusOK, inv.status, "%s", inv.raw)
	id, _ := inv.body["taskId"].(string)
	require.NotEmpty(t, id)

	again := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions/greet/invoke", map[string]any{
		"input": map[string]any{"name": "someone else"}, "idempotencyKey": "greet-ada",
	})
	require.Equal(t, http.StatusOK, again.status, "%s", again.raw)
	require.Equal(t, id, again.body["taskId"], "the same idempotency key names the same task")

	// The command reaches the dispatcher asynchronously; the task appears.
	var task restResponse
	require.Eventually(t, func() bool {
		task = s.rest(t, http.MethodGet, "/v1/namespaces/default/tasks/"+id, nil)
		return task.status == http.StatusOK
	}, wait, 10*time.Millisecond)
	require.Equal(t, "TASK_STATUS_QUEUED", task.body["status"])
	payload, err := base64.StdEncoding.DecodeString(task.body["payload"].(string))
	require.NoError(t, err)
	require.JSONEq(t, `{"name":"Ada <3"}`, string(payload))
	require.Equal(t, `{"name":"Ada <3"}`, string(payload), "input is stored as plain JSON")

	// Waiting with a short timeout on a queued task returns it as it is.
	short := s.rest(t, http.MethodGet, "/v1/namespaces/default/tasks/"+id+"/await?timeoutMs=50", nil)
	require.Equal(t, http.StatusOK, short.status, "%s", short.raw)
	require.Equal(t, "TASK_STATUS_QUEUED", short.body["status"])

	// A waiter blocked in await is woken by the task-events tail.
	awaited := make(chan restResponse, 1)
	go func() {
		awaited <- s.rest(t, http.MethodGet, "/v1/namespaces/default/tasks/"+id+"/await?timeoutMs=60000", nil)
	}()
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "rest-worker", Namespace: "default", Actions: []string{"greet"}})
	w.ready(t, 1, 20_000)
	claimed := w.tasks(t, 1)[0]
	require.Equal(t, id, claimed.GetTaskId())
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(id, claimed.GetAttempt(), `{"greeting":"hello Ada"}`)}})

	done := <-awaited
	require.Equal(t, http.StatusOK, done.status, "%s", done.raw)
	require.Equal(t, "TASK_STATUS_COMPLETED", done.body["status"])
	require.Equal(t, map[string]any{"greeting": "hello Ada"}, done.body["output"])
	require.Equal(t, "rest-worker", done.body["workerId"])
	require.NotContains(t, string(done.raw), `"error"`, "unpopulated fields are not emitted")

	dis := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions/greet/disable", nil)
	require.Equal(t, http.StatusOK, dis.status, "%s", dis.raw)
	require.Nil(t, dis.body["enabled"], "false is not emitted")
	refused := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions/greet/invoke", map[string]any{"input": 1})
	require.Equal(t, http.StatusBadRequest, refused.status, "%s", refused.raw)
	require.EqualValues(t, 9, refused.body["code"], "FailedPrecondition")
	require.Contains(t, refused.body["message"], "disabled")
	en := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions/greet/enable", nil)
	require.Equal(t, http.StatusOK, en.status, "%s", en.raw)
	require.Equal(t, true, en.body["enabled"])
	ok := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions/greet/invoke", map[string]any{"input": 1})
	require.Equal(t, http.StatusOK, ok.status, "%s", ok.raw)

	dl := s.rest(t, http.MethodGet, "/v1/namespaces/default/dead-letters", nil)
	require.Equal(t, http.StatusOK, dl.status, "%s", dl.raw)
	require.Empty(t, dl.body["tasks"])

	ns := s.rest(t, http.MethodPost, "/v1/namespaces", map[string]any{"name": "team-a"})
	require.Equal(t, http.StatusOK, ns.status, "%s", ns.raw)
	nsList := s.rest(t, http.MethodGet, "/v1/namespaces", nil)
	require.Equal(t, http.StatusOK, nsList.status)
	require.True(t, strings.Contains(string(nsList.raw), `"team-a"`), "%s", nsList.raw)
	teamAction := s.rest(t, http.MethodPost, "/v1/namespaces/team-a/actions", map[string]any{"name": "greet"})
	require.Equal(t, http.StatusOK, teamAction.status, "%s", teamAction.raw)
}
