package flo_test

import (
	"context"
	"encoding/json"
	"testing"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func (w *workflowsPeer) GetWorkflowPlans(_ context.Context, req *flov1.GetWorkflowPlansRequest) (*flov1.WorkflowPlans, error) {
	w.keep(req)
	if req.GetName() != "payment-processing" {
		return nil, status.Errorf(codes.NotFound, "workflow %s not found", req.GetName())
	}
	return &flov1.WorkflowPlans{
		Namespace: req.GetNamespace(), Name: req.GetName(), Version: "1.0.0", Replica: "workflow-7f9c",
		Plans: []*flov1.PlanStatus{{Name: "payment", Selection: "health-weighted", Executors: []*flov1.ExecutorStatus{
			{Name: "stripe-primary", Action: "charge-stripe", Priority: 100, Score: 0.07, Samples: 12,
				ApiSuccessRate: 0.5, BusinessSuccessRate: 1, Breaker: "open", AttemptsLastMinute: 12},
			{Name: "adyen-fallback", Action: "charge-adyen", Priority: 50, Score: 1, Breaker: "closed"},
		}}},
	}, nil
}

func (w *workflowsPeer) InvalidatePlanCache(_ context.Context, req *flov1.InvalidatePlanCacheRequest) (*flov1.InvalidatePlanCacheResponse, error) {
	w.keep(req)
	return &flov1.InvalidatePlanCacheResponse{Removed: 3}, nil
}

func TestClientShowsPlansAndInvalidatesTheirCache(t *testing.T) {
	t.Parallel()
	w := &workflowsPeer{}
	client := startWorkflowsPeer(t, w)
	ctx := context.Background()

	plans, err := client.GetWorkflowPlans(ctx, "payment-processing", "")
	require.NoError(t, err)
	requireSent(t, &flov1.GetWorkflowPlansRequest{Namespace: "myapp", Name: "payment-processing"}, w.last())
	require.Equal(t, &flo.WorkflowPlans{
		Namespace: "myapp", Workflow: "payment-processing", Version: "1.0.0", Replica: "workflow-7f9c",
		Plans: []flo.PlanStatus{{Name: "payment", Selection: "health-weighted", Executors: []flo.ExecutorStatus{
			{Name: "stripe-primary", Action: "charge-stripe", Priority: 100, Score: 0.07, Samples: 12,
				APISuccessRate: 0.5, BusinessSuccessRate: 1, Breaker: "open", AttemptsLastMinute: 12},
			{Name: "adyen-fallback", Action: "charge-adyen", Priority: 50, Score: 1, Breaker: "closed"},
		}}},
	}, plans)
	b, err := json.Marshal(plans.Plans[0].Executors[1])
	require.NoError(t, err)
	require.JSONEq(t, `{"name":"adyen-fallback","action":"charge-adyen","priority":50,"score":1,"samples":0,
		"api_success_rate":0,"business_success_rate":0,"breaker":"closed","attempts_last_minute":0}`, string(b))

	_, err = client.GetWorkflowPlans(ctx, "ghost", "2.0.0")
	require.Equal(t, codes.NotFound, status.Code(err))
	require.ErrorContains(t, err, "get plans of workflow ghost version 2.0.0: ")

	removed, err := client.InvalidatePlanCache(ctx, "payment.refunded", "charge:c-1:k-9")
	require.NoError(t, err)
	requireSent(t, &flov1.InvalidatePlanCacheRequest{Namespace: "myapp", Event: "payment.refunded", Key: "charge:c-1:k-9"}, w.last())
	require.EqualValues(t, 3, removed)
}
