package api_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/gateway/internal/api"
)

// A gateway without a registry answers worker-registry calls as if the
// registry were down, so an SDK worker runs on, unregistered.
func TestNoRegistryIsUnavailable(t *testing.T) {
	ctx := context.Background()
	_, err := api.NoRegistry.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, err = api.NoRegistry.Heartbeat(ctx, &flov1.HeartbeatRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, err = api.NoRegistry.GetWorker(ctx, &flov1.GetWorkerRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, err = api.NoRegistry.ListWorkers(ctx, &flov1.ListWorkersRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, err = api.NoRegistry.DrainWorker(ctx, &flov1.GetWorkerRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, err = api.NoRegistry.DeregisterWorker(ctx, &flov1.GetWorkerRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
}
