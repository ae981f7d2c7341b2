package service_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/internalauth"
	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func TestInternalCallsNeedTheInternalToken(t *testing.T) {
	t.Parallel()
	r := startReplica(t, testConfig(harness.NewDatabase(t), harness.NewBroker(t).Addrs()))
	harness.RequireInternalAuth(t, r.svc.GRPCAddr(), func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := registryv1.NewRegistryClient(conn).ListWorkers(ctx, &flov1.ListWorkersRequest{Namespace: "default"})
		return err
	})
}

// With the internal TLS files set the server speaks mutual TLS: a client of
// the cluster CA is served, a plaintext one with the right token is not.
func TestInternalCallsOverMutualTLS(t *testing.T) {
	t.Parallel()
	ca := harness.NewCA(t)
	cfg := testConfig(harness.NewDatabase(t), harness.NewBroker(t).Addrs())
	cfg.Auth.InternalCertFile, cfg.Auth.InternalKeyFile = ca.Issue(t)
	cfg.Auth.InternalCAFile = ca.File
	svc := startReplica(t, cfg).svc

	client := cfg.Auth
	client.InternalCertFile, client.InternalKeyFile = ca.Issue(t)
	opts, err := internalauth.DialOptions(client, nil)
	require.NoError(t, err)
	list := func(conn *grpc.ClientConn) error {
		_, err := registryv1.NewRegistryClient(conn).ListWorkers(t.Context(), &flov1.ListWorkersRequest{Namespace: "default"})
		return err
	}
	require.NoError(t, list(harness.DialInternal(t, svc.GRPCAddr(), opts...)))
	require.Equal(t, codes.Unavailable, status.Code(list(harness.DialInternal(t, svc.GRPCAddr()))), "plaintext")
}
