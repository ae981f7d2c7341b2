package service_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/harness"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func TestInternalCallsNeedTheInternalToken(t *testing.T) {
	t.Parallel()
	r := startReplica(t, harness.NewDatabase(t), harness.NewBroker(t).Addrs())
	harness.RequireInternalAuth(t, r.svc.GRPCAddr(), func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := dispatcherv1.NewDispatcherClient(conn).GetNamespace(ctx, &flov1.GetNamespaceRequest{Name: "default"})
		return err
	})
}
