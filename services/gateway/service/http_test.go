package service_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"

	"github.com/razorbill/flo/services/gateway/internal/auth"
	"github.com/razorbill/flo/services/gateway/service"
)

// get reads url, sending key as the bearer unless it is empty.
func get(t *testing.T, url, key string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(testContext(t), http.MethodGet, url, nil)
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, body
}

func TestOperationalEndpoints(t *testing.T) {
	s := startStack(t)

	code, body := get(t, s.base+"/openapi.json", adminToken)
	require.Equal(t, http.StatusOK, code)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(body, &doc))
	require.Equal(t, "2.0", doc["swagger"])
	require.Contains(t, doc["paths"], "/v1/namespaces/{namespace}/actions/{action}/invoke")

	// Only the probes answer without a key.
	code, _ = get(t, s.base+"/openapi.json", "")
	require.Equal(t, http.StatusUnauthorized, code)
	for _, path := range []string{"/healthz", "/readyz"} {
		code, _ = get(t, s.base+path, "")
		require.Equal(t, http.StatusOK, code, path)
	}

	// Metrics are on their own port, with the probes, and not on the
	// public one.
	code, _ = get(t, s.base+"/metrics", adminToken)
	require.Equal(t, http.StatusNotFound, code)
	metrics := "http://" + s.gateway.MetricsAddr()
	code, body = get(t, metrics+"/metrics", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(body), "go_goroutines")
	for _, path := range []string{"/healthz", "/readyz"} {
		code, _ = get(t, metrics+path, "")
		require.Equal(t, http.StatusOK, code, path)
	}
}

// TestNotReadyWithoutDispatcher runs a gateway whose dispatcher never
// answers: it is alive but not ready.
func TestNotReadyWithoutDispatcher(t *testing.T) {
	broker := harness.NewBroker(t)
	deadAddr := harness.DeadPeer(t)

	ctx, cancel := context.WithCancel(context.Background())
	gw, err := service.New(ctx, service.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DispatcherAddr: deadAddr, RegistryAddr: deadAddr,
		MaxPayloadBytes: testMaxPayload, Kafka: config.Kafka{Brokers: broker.Addrs(), Partitions: 1},
		Auth: harness.InternalAuth(), APIKeys: auth.Config{AdminToken: adminToken},
	}, testLogger(t))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	base := "http://" + gw.HTTPAddr()
	require.Eventually(t, func() bool {
		code, _ := get(t, base+"/healthz", "")
		return code == http.StatusOK
	}, wait, 10*time.Millisecond)
	code, _ := get(t, base+"/readyz", "")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.False(t, gw.Ready())
}
