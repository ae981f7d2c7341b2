package service_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/harness"
	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func TestInternalCallsNeedTheInternalToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start(t, e.config())
	harness.RequireInternalAuth(t, r.svc.GRPCAddr(), func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := streamsv1.NewStreamsClient(conn).ListStreams(ctx, &flov1.ListStreamsRequest{Namespace: "default"})
		return err
	})
}
