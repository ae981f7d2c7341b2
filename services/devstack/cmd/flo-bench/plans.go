package main

import (
	"context"
	"fmt"
)

// benchOneAction is a one-step workflow whose step is a plain action.
const benchOneAction = `kind: Workflow
name: bench-action
version: "1"
start:
  run: "@actions/bench-pay"
  inputMapping: '{"run": "$.flo.run_id"}'
  transitions:
    success: flo.Completed
    failure: flo.Failed
`

// benchOnePlan is the same workflow whose step is a two-executor plan over
// the same action: the plan's own work (ordering, breaker and health
// bookkeeping, history) is what the two phases differ by.
const benchOnePlan = `kind: Workflow
name: bench-plan
version: "1"
plans:
  pay:
    selection: health-weighted
    executors:
      - name: primary
        action: "@actions/bench-pay"
        priority: 10
        breaker: {failure_threshold: 5, cooldown_ms: 30000}
      - name: backup
        action: "@actions/bench-pay-backup"
        priority: 1
    health: {window_ms: 60000, decay: 0.9, min_samples: 10}
start:
  run: "@plan/pay"
  inputMapping: '{"run": "$.flo.run_id"}'
  transitions:
    success: flo.Completed
    failure: flo.Failed
`

// benchPlans measures runs/s of benchOnePlan beside benchOneAction in one
// process: action, plan, action, plan, so drift over the run shows.
func benchPlans(ctx context.Context, p *platform, o options) error {
	last := newLastSteps()
	handlers := map[string]actionHandler{
		"bench-pay":        last.handler,
		"bench-pay-backup": last.handler,
	}
	if err := p.serveActions(ctx, o, handlers); err != nil {
		return err
	}
	for _, def := range []string{benchOneAction, benchOnePlan} {
		if _, _, err := p.client.CreateWorkflow(ctx, def); err != nil {
			return fmt.Errorf("create workflow: %w", err)
		}
	}
	fmt.Printf("plans: %d runs per phase of a one-step workflow, its step a plain action or a two-executor plan; %d starters, %d workers x %d slots, fsync=%v\n",
		o.runs, o.starters, o.workers, o.concurrency, o.fsync)
	stopProfile, err := profile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	for range 2 {
		for _, wf := range []string{"bench-action", "bench-plan"} {
			m, err := measureRuns(ctx, p, o, wf, last)
			if err != nil {
				return fmt.Errorf("%s: %w", wf, err)
			}
			m.print(fmt.Sprintf("%-12s ", wf))
		}
	}
	return nil
}
