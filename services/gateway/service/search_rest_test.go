package service_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSearchAttributesOverREST starts runs with search attributes, reads
// them in a run's status, and lists runs with the where query parameter;
// a bad query is a 400 naming the position.
func TestSearchAttributesOverREST(t *testing.T) {
	s := startWorkflowStack(t)
	created := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows", map[string]any{"yaml": `kind: Workflow
name: orders
version: "1"
searchAttributes:
  - {name: customer_id, type: string, from: input.customer_id}
  - {name: order_amount, type: number, from: input.amount}
start:
  waitForSignal: {type: go, timeoutMs: 600000}
  transitions: {success: flo.Completed}
`})
	require.Equal(t, http.StatusOK, created.status, "%s", created.raw)
	var ids []string
	for _, input := range []map[string]any{
		{"customer_id": "c-42", "amount": 150}, {"customer_id": "c-42", "amount": 50}, {"customer_id": "c-7", "amount": 500},
	} {
		started := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows/orders/runs", map[string]any{"inputValue": input})
		require.Equal(t, http.StatusOK, started.status, "%s", started.raw)
		ids = append(ids, started.body["runId"].(string))
	}

	run := s.rest(t, http.MethodGet, "/v1/namespaces/default/runs/"+ids[0], nil)
	require.Equal(t, http.StatusOK, run.status, "%s", run.raw)
	require.ElementsMatch(t, []any{
		map[string]any{"name": "customer_id", "stringValue": "c-42"},
		map[string]any{"name": "order_amount", "numberValue": float64(150)},
	}, run.body["searchAttributes"])

	where := url.QueryEscape(`customer_id = "c-42" AND order_amount > 100`)
	got := s.rest(t, http.MethodGet, "/v1/namespaces/default/runs?where="+where, nil)
	require.Equal(t, http.StatusOK, got.status, "%s", got.raw)
	runs := objects(t, got.body["runs"])
	require.Len(t, runs, 1)
	require.Equal(t, ids[0], runs[0]["runId"])

	bad := s.rest(t, http.MethodGet, "/v1/namespaces/default/runs?where="+url.QueryEscape(`order_amount > "x"`), nil)
	require.Equal(t, http.StatusBadRequest, bad.status, "%s", bad.raw)
	require.Contains(t, string(bad.raw), "where: at 16: type mismatch")

	wrong := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows/orders/runs", map[string]any{"inputValue": map[string]any{"amount": "lots"}})
	require.Equal(t, http.StatusBadRequest, wrong.status, "%s", wrong.raw)
	require.Contains(t, string(wrong.raw), "search attribute order_amount")
}
