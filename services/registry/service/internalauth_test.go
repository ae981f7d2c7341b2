package service_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/harness"
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
