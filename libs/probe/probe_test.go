package probe_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/probe"
)

func TestHandler(t *testing.T) {
	t.Parallel()
	var notReady atomic.Bool
	ready := func(context.Context) error {
		if notReady.Load() {
			return errors.New("database: down")
		}
		return nil
	}
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("flo_up 1\n")) })
	get := func(h http.Handler, method, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Code, rec.Body.String()
	}

	h := probe.Handler(ready, metrics)
	tests := []struct {
		name     string
		method   string
		path     string
		notReady bool
		code     int
		body     string
	}{
		{name: "healthz", method: http.MethodGet, path: "/healthz", code: http.StatusOK, body: "ok\n"},
		{name: "healthz while not ready", method: http.MethodGet, path: "/healthz", notReady: true, code: http.StatusOK, body: "ok\n"},
		{name: "readyz", method: http.MethodGet, path: "/readyz", code: http.StatusOK, body: "ok\n"},
		{name: "readyz not ready", method: http.MethodGet, path: "/readyz", notReady: true, code: http.StatusServiceUnavailable, body: "not ready: database: down\n"},
		{name: "metrics", method: http.MethodGet, path: "/metrics", code: http.StatusOK, body: "flo_up 1\n"},
		{name: "unknown path", method: http.MethodGet, path: "/other", code: http.StatusNotFound},
		{name: "wrong method", method: http.MethodPost, path: "/readyz", code: http.StatusMethodNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			notReady.Store(tt.notReady)
			code, body := get(h, tt.method, tt.path)
			require.Equal(t, tt.code, code)
			if tt.body != "" {
				require.Equal(t, tt.body, body)
			}
		})
	}

	code, _ := get(probe.Handler(ready, nil), http.MethodGet, "/metrics")
	require.Equal(t, http.StatusNotFound, code, "no metrics handler, no /metrics")
}
