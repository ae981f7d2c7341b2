package service_test

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSchedulesOverREST lists the schedule of the reference's
// reconcile-accounts over the REST route.
func TestSchedulesOverREST(t *testing.T) {
	s := startWorkflowStack(t)
	src, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "workflows", "reconcile-accounts.yaml"))
	require.NoError(t, err)
	created := s.rest(t, http.MethodPost, "/v1/namespaces/default/workflows", map[string]any{"yaml": string(src)})
	require.Equal(t, http.StatusOK, created.status, "%s", created.raw)

	got := s.rest(t, http.MethodGet, "/v1/namespaces/default/schedules", nil)
	require.Equal(t, http.StatusOK, got.status, "%s", got.raw)
	schedules := objects(t, got.body["schedules"])
	require.Len(t, schedules, 1)
	sc := schedules[0]
	require.Equal(t, "reconcile-accounts", sc["workflow"])
	require.Equal(t, "1.0.0", sc["version"])
	require.Equal(t, "0 */6 * * *", sc["cron"])
	require.Equal(t, "UTC", sc["timezone"])
	require.Equal(t, float64(1), sc["maxConcurrent"])
	require.Equal(t, "active", sc["state"])
	next, err := time.Parse(time.RFC3339, sc["nextFireAt"].(string))
	require.NoError(t, err)
	require.Zero(t, next.Minute(), "every 6 hours, on the hour")
	require.Zero(t, next.Hour()%6)
	require.WithinDuration(t, time.Now(), next, 6*time.Hour)

	bad := s.rest(t, http.MethodGet, "/v1/namespaces/default/schedules?limit=5000", nil)
	require.Equal(t, http.StatusBadRequest, bad.status, "%s", bad.raw)
}
