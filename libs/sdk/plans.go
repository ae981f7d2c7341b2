package flo

import (
	"context"
	"fmt"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// WorkflowPlans is the plans of one workflow version as one replica of the workflow service
// sees them. Health scores, samples, breakers and attempt counts are kept in memory by each
// replica and start over when it restarts, so another replica may answer differently.
type WorkflowPlans struct {
	Namespace string `json:"namespace"`
	Workflow  string `json:"workflow"`
	Version   string `json:"version"`
	// Replica is the host name of the workflow service replica that answered.
	Replica string `json:"replica"`
	// Plans are in the order the definition declares them.
	Plans []PlanStatus `json:"plans"`
}

// PlanStatus is one plan of a workflow version and its executors.
type PlanStatus struct {
	Name string `json:"name"`
	// Selection orders the executors: static-order, round-robin, random or health-weighted.
	Selection string `json:"selection"`
	// Executors are in the order the definition lists them.
	Executors []ExecutorStatus `json:"executors"`
}

// ExecutorStatus is one executor of a plan as the answering replica sees it.
type ExecutorStatus struct {
	Name     string `json:"name"`
	Action   string `json:"action"`
	Priority int    `json:"priority"`
	// Score is the health score, from 0 to 1: APISuccessRate*0.7 + BusinessSuccessRate*0.3,
	// times 0.1 with the breaker open and 0.5 half-open. Below the plan's min_samples it is 1
	// whatever the breaker's state: the executor is ordered by priority until it has samples.
	Score float64 `json:"score"`
	// Samples counts the outcomes inside the plan's health window.
	Samples int `json:"samples"`
	// APISuccessRate is the decay-weighted share of attempts in which the executor did the
	// work: not a failure without a fatal error code, a timeout, or a missing or disabled
	// action.
	APISuccessRate float64 `json:"api_success_rate"`
	// BusinessSuccessRate is the decay-weighted share of those the executor did not refuse with
	// a fatal error code.
	BusinessSuccessRate float64 `json:"business_success_rate"`
	// Breaker is closed, open or half-open; none when the executor has no breaker.
	Breaker string `json:"breaker"`
	// AttemptsLastMinute counts the attempts this replica started in the last minute.
	AttemptsLastMinute int64 `json:"attempts_last_minute"`
}

// GetWorkflowPlans returns the plans of version of the workflow name (the latest when version
// is empty) with each executor's health, breaker and recent attempts on the workflow service
// replica that answers; [WorkflowPlans.Replica] names it.
func (c *Client) GetWorkflowPlans(ctx context.Context, name, version string) (*WorkflowPlans, error) {
	svc, err := c.workflowService()
	if err != nil {
		return nil, err
	}
	resp, err := svc.GetWorkflowPlans(ctx, &flov1.GetWorkflowPlansRequest{Namespace: c.namespace, Name: name, Version: version})
	if err != nil {
		if version != "" {
			return nil, fmt.Errorf("get plans of workflow %s version %s: %w", name, version, err)
		}
		return nil, fmt.Errorf("get plans of workflow %s: %w", name, err)
	}
	out := &WorkflowPlans{
		Namespace: resp.GetNamespace(), Workflow: resp.GetName(), Version: resp.GetVersion(), Replica: resp.GetReplica(),
		Plans: make([]PlanStatus, 0, len(resp.GetPlans())),
	}
	for _, p := range resp.GetPlans() {
		ps := PlanStatus{Name: p.GetName(), Selection: p.GetSelection(), Executors: make([]ExecutorStatus, 0, len(p.GetExecutors()))}
		for _, e := range p.GetExecutors() {
			ps.Executors = append(ps.Executors, ExecutorStatus{
				Name: e.GetName(), Action: e.GetAction(), Priority: int(e.GetPriority()),
				Score: e.GetScore(), Samples: int(e.GetSamples()),
				APISuccessRate: e.GetApiSuccessRate(), BusinessSuccessRate: e.GetBusinessSuccessRate(),
				Breaker: e.GetBreaker(), AttemptsLastMinute: e.GetAttemptsLastMinute(),
			})
		}
		out.Plans = append(out.Plans, ps)
	}
	return out, nil
}

// InvalidatePlanCache removes the client's namespace's cached plan outcomes whose plan lists
// event in its cache's invalidate_on, and returns how many it removed. With a key, it removes
// only the entry stored under that rendered cache key ("charge:c-1:k-9"). The cache is shared
// by every replica, so the next run of such a plan calls an executor again. event follows the
// signal type rule; an empty one is refused (InvalidArgument).
func (c *Client) InvalidatePlanCache(ctx context.Context, event, key string) (int64, error) {
	svc, err := c.workflowService()
	if err != nil {
		return 0, err
	}
	resp, err := svc.InvalidatePlanCache(ctx, &flov1.InvalidatePlanCacheRequest{Namespace: c.namespace, Event: event, Key: key})
	if err != nil {
		return 0, fmt.Errorf("invalidate plan cache on %s: %w", event, err)
	}
	return resp.GetRemoved(), nil
}
