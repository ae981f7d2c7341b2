package auth_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/gateway/internal/auth"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// serveHTTP serves the test task service over REST behind the guard, with
// the probes and a plain route beside grpc-gateway as in the gateway.
func serveHTTP(t *testing.T, g *auth.Guard) string {
	t.Helper()
	gw := runtime.NewServeMux(runtime.WithMiddlewares(g.REST()))
	require.NoError(t, flov1.RegisterTaskServiceHandlerServer(t.Context(), gw, taskServer{}))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "{}") })
	mux.Handle("/", gw)
	srv := httptest.NewServer(g.HTTP(mux))
	t.Cleanup(srv.Close)
	return srv.URL
}

type reply struct {
	status     int
	code       int
	message    string
	retryAfter string
}

func call(t *testing.T, method, url, key, contentType, body string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	require.NoError(t, err)
	if body == "" {
		req.Body = http.NoBody
		req.ContentLength = 0
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	r := reply{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	if resp.StatusCode == http.StatusUnauthorized {
		require.Equal(t, `Bearer realm="flo"`, resp.Header.Get("WWW-Authenticate"))
	}
	if resp.StatusCode >= 400 {
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e), "errors are JSON in the grpc-gateway shape")
		r.code, r.message = e.Code, e.Message
	}
	return r
}

func TestRESTChecksKeyRoleNamespaceAndContentType(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	base := serveHTTP(t, e.guard)
	clientKey := e.store.add(t, "a", auth.RoleClient, nil)
	readKey := e.store.add(t, "a", auth.RoleRead, nil)
	otherNS := e.store.add(t, "b", auth.RoleClient, nil)
	revoked := e.store.add(t, "a", auth.RoleClient, func(k *auth.StoredKey) { k.Revoked = true })
	invokeA := base + "/v1/namespaces/a/actions/x/invoke"
	getA := base + "/v1/namespaces/a/tasks/t1"

	tests := []struct {
		name        string
		method, url string
		key         string
		contentType string
		body        string
		status      int
		code        int
	}{
		{name: "health is open", method: "GET", url: base + "/healthz", status: 200},
		{name: "missing key", method: "POST", url: invokeA, contentType: "application/json", body: "{}", status: 401, code: 16},
		{name: "revoked key", method: "POST", url: invokeA, key: revoked, contentType: "application/json", body: "{}", status: 401, code: 16},
		{name: "openapi needs a key", method: "GET", url: base + "/openapi.json", status: 401, code: 16},
		{name: "openapi with any key", method: "GET", url: base + "/openapi.json", key: readKey, status: 200},
		{name: "key of another namespace", method: "POST", url: invokeA, key: otherNS, contentType: "application/json", body: "{}", status: 403, code: 7},
		{name: "read key may not invoke", method: "POST", url: invokeA, key: readKey, contentType: "application/json", body: "{}", status: 403, code: 7},
		{name: "read key reads", method: "GET", url: getA, key: readKey, status: 200},
		{name: "read key of another namespace", method: "GET", url: base + "/v1/namespaces/b/tasks/t1", key: readKey, status: 403, code: 7},
		{name: "client key invokes", method: "POST", url: invokeA, key: clientKey, contentType: "application/json", body: "{}", status: 200},
		{name: "JSON with a charset", method: "POST", url: invokeA, key: clientKey, contentType: "application/json; charset=utf-8", body: "{}", status: 200},
		{name: "form post", method: "POST", url: invokeA, key: clientKey, contentType: "application/x-www-form-urlencoded", body: "a=1", status: 415},
		{name: "body without a content type", method: "POST", url: invokeA, key: clientKey, body: "{}", status: 415},
		{name: "admin token", method: "POST", url: base + "/v1/namespaces/b/actions/x/invoke", key: adminToken, contentType: "application/json", body: "{}", status: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := call(t, tc.method, tc.url, tc.key, tc.contentType, tc.body)
			require.Equal(t, tc.status, r.status, "%+v", r)
			if tc.code != 0 {
				require.Equal(t, tc.code, r.code, "%+v", r)
				require.NotEmpty(t, r.message)
			}
		})
	}
}

func TestRESTRateLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(o *auth.Options) { o.Rates = map[auth.Role]float64{auth.RoleRead: 0.5} })
	base := serveHTTP(t, e.guard)
	limited := e.store.add(t, "a", auth.RoleRead, nil)
	other := e.store.add(t, "a", auth.RoleRead, nil)
	url := base + "/v1/namespaces/a/tasks/t1"

	require.Equal(t, 200, call(t, "GET", url, limited, "", "").status)
	r := call(t, "GET", url, limited, "", "")
	require.Equal(t, 429, r.status, "%+v", r)
	require.Equal(t, "2", r.retryAfter, "a token every 2 s")
	require.Equal(t, 200, call(t, "GET", url, other, "", "").status)
}
