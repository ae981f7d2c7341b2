package devstack_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestStackRunsWithAuthOn: the stack `flo dev` runs refuses calls without its
// admin key, over gRPC and REST, takes them with it, and leaves only the
// probes open.
func TestStackRunsWithAuthOn(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	bare, err := grpc.NewClient(e.stack.GatewayGRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { bare.Close() })
	_, err = flov1.NewNamespaceServiceClient(bare).ListNamespaces(ctx, &flov1.ListNamespacesRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	_, err = flov1.NewNamespaceServiceClient(dial(t, e.stack.GatewayGRPCAddr())).ListNamespaces(ctx, &flov1.ListNamespacesRequest{})
	require.NoError(t, err)

	base := "http://" + e.stack.GatewayHTTPAddr()
	resp, err := http.Get(base + "/v1/namespaces")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp, err = restCall(http.MethodGet, base+"/v1/namespaces", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for _, open := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(base + open)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, open)
	}
	require.Equal(t, testAdminToken, e.stack.AdminToken())
}
