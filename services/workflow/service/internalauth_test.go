package service_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	workflowv1 "github.com/razorbill/flo/proto/gen/flo/workflow/v1"
	"github.com/razorbill/flo/services/workflow/service"
)

func TestInternalCallsNeedTheInternalToken(t *testing.T) {
	t.Parallel()
	wf := startWorkflow(t, harness.NewDatabase(t), harness.NewBroker(t).Addrs())
	harness.RequireInternalAuth(t, wf.svc.GRPCAddr(), func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := workflowv1.NewWorkflowsClient(conn).ListWorkflows(ctx, &flov1.ListWorkflowsRequest{Namespace: "default"})
		return err
	})
}

func TestNewRefusesToStartWithoutTheInternalToken(t *testing.T) {
	t.Parallel()
	_, err := service.New(t.Context(), service.Config{
		MaxPayloadBytes: 1024, TimerTick: time.Second,
		Postgres: config.Postgres{URL: "postgres://x"}, Kafka: config.Kafka{Brokers: []string{"x"}},
	}, nil)
	require.ErrorContains(t, err, "FLO_INTERNAL_TOKEN")
}
