package service_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"

	"github.com/razorbill/flo/services/gateway/internal/auth"
	"github.com/razorbill/flo/services/gateway/service"
)

// TestGatewayRefusesToStartWithoutCredentials checks that authentication is
// off only on purpose: without an admin token, or without the internal
// token, the gateway does not start unless FLO_AUTH=off says so.
func TestGatewayRefusesToStartWithoutCredentials(t *testing.T) {
	dead := harness.DeadPeer(t)
	base := service.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DispatcherAddr: dead, MaxPayloadBytes: testMaxPayload}
	for _, tc := range []struct {
		name    string
		auth    config.Auth
		keys    auth.Config
		tlsCert string
		want    string
	}{
		{name: "no admin token", auth: harness.InternalAuth(), want: "FLO_ADMIN_TOKEN"},
		{name: "no internal token", auth: config.Auth{Mode: "on"}, keys: auth.Config{AdminToken: adminToken}, want: "FLO_INTERNAL_TOKEN"},
		{name: "certificate without key", auth: harness.InternalAuth(), keys: auth.Config{AdminToken: adminToken}, tlsCert: "tls.crt", want: "FLO_GATEWAY_TLS_KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.Auth, cfg.APIKeys, cfg.TLSCertFile = tc.auth, tc.keys, tc.tlsCert
			_, err := service.New(context.Background(), cfg, testLogger(t))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestAuthOffServesCallsWithoutAKey runs every service with FLO_AUTH=off and
// the gateway without an admin token: calls without a key are served.
func TestAuthOffServesCallsWithoutAKey(t *testing.T) {
	s := newStack(t, stackOptions{authOff: true})
	code, body := get(t, s.base+"/v1/namespaces", "")
	require.Equal(t, http.StatusOK, code, "%s", body)
	require.Contains(t, string(body), `"default"`)
}
