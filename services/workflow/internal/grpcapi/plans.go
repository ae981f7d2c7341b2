package grpcapi

import (
	"context"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/internal/runner"
)

// GetWorkflowPlans reports a workflow version's plans with each executor's
// state on this replica.
func (s *Server) GetWorkflowPlans(ctx context.Context, req *flov1.GetWorkflowPlansRequest) (*flov1.WorkflowPlans, error) {
	// The answer names the version, so the latest is resolved here.
	w, err := s.catalog.Get(ctx, req.GetNamespace(), req.GetName(), req.GetVersion())
	if err != nil {
		return nil, err
	}
	replica, plans, err := s.runner.PlanStatus(ctx, w.Namespace, w.Name, w.Version)
	if err != nil {
		return nil, err
	}
	out := &flov1.WorkflowPlans{Namespace: w.Namespace, Name: w.Name, Version: w.Version, Replica: replica}
	for _, p := range plans {
		out.Plans = append(out.Plans, planProto(p))
	}
	return out, nil
}

// InvalidatePlanCache removes the cached plan outcomes an event invalidates.
func (s *Server) InvalidatePlanCache(ctx context.Context, req *flov1.InvalidatePlanCacheRequest) (*flov1.InvalidatePlanCacheResponse, error) {
	n, err := s.runner.InvalidatePlanCache(ctx, req.GetNamespace(), req.GetEvent(), req.GetKey())
	if err != nil {
		return nil, err
	}
	return &flov1.InvalidatePlanCacheResponse{Removed: n}, nil
}

func planProto(p runner.PlanReport) *flov1.PlanStatus {
	out := &flov1.PlanStatus{Name: p.Plan.Name, Selection: string(p.Plan.Selection)}
	for _, st := range p.Executors {
		e := &flov1.ExecutorStatus{
			Name: st.Executor, Score: st.Score, Samples: int32(st.Samples),
			ApiSuccessRate: st.APISuccessRate, BusinessSuccessRate: st.BusinessSuccessRate,
			Breaker: st.Breaker, AttemptsLastMinute: int64(st.AttemptsLastMinute),
		}
		if ex, ok := p.Plan.Executor(st.Executor); ok {
			e.Action, e.Priority = ex.Action, int32(ex.Priority)
		}
		out.Executors = append(out.Executors, e)
	}
	return out
}
