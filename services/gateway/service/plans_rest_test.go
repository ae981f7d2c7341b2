package service_test

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWorkflowPlansOverREST reads the plans of the reference payment-processing workflow before
// any run, and invalidates its cache, over the REST routes.
func TestWorkflowPlansOverREST(t *testing.T) {
	s := startWorkflowStack(t)
	src, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "workflows", "payment-processing.yaml"))
	require.NoError(t, err)
	created := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows", map[string]any{"yaml": string(src)})
	require.Equal(t, http.StatusOK, created.status, "%s", created.raw)

	got := s.rest(t, http.MethodGet, "/v1/namespaces/default/workflows/payment-processing/plans", nil)
	require.Equal(t, http.StatusOK, got.status, "%s", got.raw)
	require.Equal(t, "payment-processing", got.body["name"])
	require.Equal(t, "1.0.0", got.body["version"], "the latest version")
	require.NotEmpty(t, got.body["replica"])
	plans := objects(t, got.body["plans"])
	require.Len(t, plans, 1)
	require.Equal(t, "charge-payment", plans[0]["name"])
	require.Equal(t, "health-weighted", plans[0]["selection"])
	executors := objects(t, plans[0]["executors"])
	require.Len(t, executors, 2)
	// Zero counts are left out of the JSON, as every zero is.
	require.Equal(t, map[string]any{
		"name": "stripe-primary", "action": "charge-stripe", "priority": float64(100),
		"score": float64(1), "apiSuccessRate": float64(1), "businessSuccessRate": float64(1), "breaker": "closed",
	}, executors[0])
	require.Equal(t, "adyen-fallback", executors[1]["name"])
	require.Equal(t, float64(1), executors[1]["score"])
	require.Equal(t, "none", executors[1]["breaker"], "it has no breaker block")

	same := s.rest(t, http.MethodGet, "/v1/namespaces/default/workflows/payment-processing/plans?version=1.0.0", nil)
	require.Equal(t, http.StatusOK, same.status, "%s", same.raw)
	require.Equal(t, got.body["plans"], same.body["plans"])

	none := s.rest(t, http.MethodPost, "/v1/namespaces/default/plan-cache:invalidate", map[string]any{"event": "payment.refunded"})
	require.Equal(t, http.StatusOK, none.status, "%s", none.raw)
	require.Nil(t, none.body["removed"], "nothing cached: 0, left out")
	keyed := s.rest(t, http.MethodPost, "/v1/namespaces/default/plan-cache:invalidate", map[string]any{"event": "payment.refunded", "key": "charge:c-1:k-1"})
	require.Equal(t, http.StatusOK, keyed.status, "%s", keyed.raw)
	require.Nil(t, keyed.body["removed"])
}
