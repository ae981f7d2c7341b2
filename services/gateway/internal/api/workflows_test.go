package api_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/razorbill/flo/libs/harness"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	workflowv1 "github.com/razorbill/flo/proto/gen/flo/workflow/v1"
	"github.com/razorbill/flo/services/gateway/internal/api"
	"github.com/razorbill/flo/services/gateway/internal/namespace"
)

const testMaxPayload = 64

// namespaces knows only "default".
func namespaces() *namespace.Cache {
	return namespace.NewCache(func(_ context.Context, name string) error {
		if name != "default" {
			return namespace.ErrNotFound
		}
		return nil
	})
}

// downWorkflowServer is a WorkflowServer whose workflow service is down:
// whatever passes the gateway's checks fails with Unavailable, so a call
// refused with another code was refused at the edge.
func downWorkflowServer(t *testing.T) *api.WorkflowServer {
	t.Helper()
	conn, err := grpc.NewClient(harness.DeadPeer(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return api.NewWorkflowServer(workflowv1.NewWorkflowsClient(conn), namespaces(), testMaxPayload, slog.New(slog.DiscardHandler))
}

func TestWorkflowCallsAreCheckedAtTheEdge(t *testing.T) {
	s := downWorkflowServer(t)
	const runID = "0b9c7f5e-8a4a-4d57-9d0e-4f7f7f2b9d11"
	big := strings.Repeat("x", testMaxPayload)
	bigValue := structpb.NewStringValue(big) // encodes with quotes: 2 bytes over

	tests := []struct {
		name string
		call func(context.Context) error
		code codes.Code
		msg  string
	}{
		{"unknown namespace", func(ctx context.Context) error {
			_, err := s.ListWorkflows(ctx, &flov1.ListWorkflowsRequest{Namespace: "nope"})
			return err
		}, codes.NotFound, `namespace "nope" not found`},
		{"missing namespace", func(ctx context.Context) error {
			_, err := s.CreateWorkflow(ctx, &flov1.CreateWorkflowRequest{Yaml: "kind: Workflow"})
			return err
		}, codes.InvalidArgument, "namespace is required"},
		{"missing workflow name", func(ctx context.Context) error {
			_, err := s.GetWorkflow(ctx, &flov1.GetWorkflowRequest{Namespace: "default"})
			return err
		}, codes.InvalidArgument, "name is required"},
		{"bad workflow name", func(ctx context.Context) error {
			_, err := s.DisableWorkflow(ctx, &flov1.WorkflowNameRequest{Namespace: "default", Name: "-x"})
			return err
		}, codes.InvalidArgument, `name "-x" is invalid`},
		{"workflow name too long", func(ctx context.Context) error {
			_, err := s.EnableWorkflow(ctx, &flov1.WorkflowNameRequest{Namespace: "default", Name: strings.Repeat("a", 129)})
			return err
		}, codes.InvalidArgument, "is invalid: use 1 to 128"},
		{"bad name filter", func(ctx context.Context) error {
			_, err := s.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: "default", Workflow: "a b"})
			return err
		}, codes.InvalidArgument, `workflow "a b" is invalid`},
		{"bad version", func(ctx context.Context) error {
			_, err := s.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "w", Version: "1 0"})
			return err
		}, codes.InvalidArgument, `version "1 0" is invalid`},
		{"start without workflow", func(ctx context.Context) error {
			_, err := s.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default"})
			return err
		}, codes.InvalidArgument, "workflow is required"},
		{"input over the limit", func(ctx context.Context) error {
			_, err := s.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "w", Input: []byte(`"` + big + `"`)})
			return err
		}, codes.InvalidArgument, "input is 66 bytes, limit is 64"},
		{"input value over the limit", func(ctx context.Context) error {
			_, err := s.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "w", InputValue: bigValue})
			return err
		}, codes.InvalidArgument, "input is 66 bytes, limit is 64"},
		{"missing run id", func(ctx context.Context) error {
			_, err := s.GetRun(ctx, &flov1.GetRunRequest{Namespace: "default"})
			return err
		}, codes.InvalidArgument, "run_id is required"},
		{"run id not a UUID", func(ctx context.Context) error {
			_, err := s.GetRunHistory(ctx, &flov1.GetRunRequest{Namespace: "default", RunId: "run-1"})
			return err
		}, codes.InvalidArgument, `run_id "run-1" is not a UUID`},
		{"cancel with bad run id", func(ctx context.Context) error {
			_, err := s.CancelRun(ctx, &flov1.CancelRunRequest{Namespace: "default", RunId: "x"})
			return err
		}, codes.InvalidArgument, `run_id "x" is not a UUID`},
		{"missing signal type", func(ctx context.Context) error {
			_, err := s.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: "default", RunId: runID})
			return err
		}, codes.InvalidArgument, "type is required"},
		{"bad signal type", func(ctx context.Context) error {
			_, err := s.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: "default", RunId: runID, Type: ":go"})
			return err
		}, codes.InvalidArgument, `type ":go" is invalid`},
		{"signal payload over the limit", func(ctx context.Context) error {
			_, err := s.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: "default", RunId: runID, Type: "go", Value: bigValue})
			return err
		}, codes.InvalidArgument, "payload is 66 bytes, limit is 64"},
		{"plans without workflow name", func(ctx context.Context) error {
			_, err := s.GetWorkflowPlans(ctx, &flov1.GetWorkflowPlansRequest{Namespace: "default"})
			return err
		}, codes.InvalidArgument, "name is required"},
		{"plans of a bad version", func(ctx context.Context) error {
			_, err := s.GetWorkflowPlans(ctx, &flov1.GetWorkflowPlansRequest{Namespace: "default", Name: "w", Version: "1 0"})
			return err
		}, codes.InvalidArgument, `version "1 0" is invalid`},
		{"invalidation without event", func(ctx context.Context) error {
			_, err := s.InvalidatePlanCache(ctx, &flov1.InvalidatePlanCacheRequest{Namespace: "default"})
			return err
		}, codes.InvalidArgument, "event is required"},
		{"invalidation of a bad event", func(ctx context.Context) error {
			_, err := s.InvalidatePlanCache(ctx, &flov1.InvalidatePlanCacheRequest{Namespace: "default", Event: ".refunded"})
			return err
		}, codes.InvalidArgument, `event ".refunded" is invalid`},
		{"invalidation of a key with NUL", func(ctx context.Context) error {
			_, err := s.InvalidatePlanCache(ctx, &flov1.InvalidatePlanCacheRequest{Namespace: "default", Event: "payment.refunded", Key: "a\x00b"})
			return err
		}, codes.InvalidArgument, "key must not contain NUL"},

		// What passes the checks reaches the service, which is down.
		{"valid invalidation", func(ctx context.Context) error {
			_, err := s.InvalidatePlanCache(ctx, &flov1.InvalidatePlanCacheRequest{Namespace: "default", Event: "payment.refunded", Key: "charge:c1:k1"})
			return err
		}, codes.Unavailable, ""},
		{"valid start", func(ctx context.Context) error {
			_, err := s.StartRun(ctx, &flov1.StartRunRequest{
				Namespace: "default", Workflow: "process-order", Version: "1.0.0+build",
				InputValue: structpb.NewStringValue(strings.Repeat("x", testMaxPayload-2)),
			})
			return err
		}, codes.Unavailable, ""},
		{"valid signal", func(ctx context.Context) error {
			_, err := s.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: "default", RunId: runID, Type: "order:approved_v1.2"})
			return err
		}, codes.Unavailable, ""},
		{"list without filter", func(ctx context.Context) error {
			_, err := s.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: "default"})
			return err
		}, codes.Unavailable, ""},
		{"validate", func(ctx context.Context) error {
			_, err := s.ValidateWorkflow(ctx, &flov1.ValidateWorkflowRequest{Namespace: "default"})
			return err
		}, codes.Unavailable, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(t.Context())
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tc.msg)
		})
	}
}

// A gateway without a workflow service refuses workflow calls as if it were
// down, naming the variable that configures it.
func TestNoWorkflowServiceIsUnavailable(t *testing.T) {
	s := api.NewWorkflowServer(nil, namespaces(), testMaxPayload, slog.New(slog.DiscardHandler))
	_, err := s.ListWorkflows(t.Context(), &flov1.ListWorkflowsRequest{Namespace: "default"})
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "FLO_WORKFLOW_ADDR")
	_, err = s.StartRun(t.Context(), &flov1.StartRunRequest{Namespace: "default", Workflow: "w"})
	require.ErrorIs(t, err, api.ErrNoWorkflows)
}
