package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	flo "github.com/razorbill/flo-go"
)

// benchWorkflow is three steps, each a trivial action. The last step is
// given the run id, so the bench learns without asking that a run has
// reached its last action.
const benchWorkflow = `kind: Workflow
name: bench
version: "1"
start:
  run: "@actions/bench-first"
  transitions:
    success: second
    failure: flo.Failed
steps:
  second:
    run: "@actions/bench-second"
    transitions:
      success: third
      failure: flo.Failed
  third:
    run: "@actions/bench-third"
    inputMapping: '{"run": "$.flo.run_id"}'
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// benchWorkflows starts o.runs runs of benchWorkflow from o.starters
// goroutines, waits for all of them to complete, and prints runs/s and the
// start-to-complete latency the runs themselves report (created_at to
// finished_at).
func benchWorkflows(ctx context.Context, p *platform, o options) error {
	// Every run's last action reports its run once; when all have, the runs
	// are about to complete and only then is the service asked.
	var (
		mu       sync.Mutex
		lastStep = make(map[string]bool, o.runs)
		allLast  = make(chan struct{})
	)
	handlers := map[string]actionHandler{
		"bench-first":  func(*flo.ActionContext) ([]byte, error) { return []byte(`{"ok":true}`), nil },
		"bench-second": func(*flo.ActionContext) ([]byte, error) { return []byte(`{"ok":true}`), nil },
		"bench-third": func(actx *flo.ActionContext) ([]byte, error) {
			var in struct {
				Run string `json:"run"`
			}
			if err := actx.Into(&in); err != nil {
				return nil, flo.NewNonRetryableErrorf("bad input: %v", err)
			}
			mu.Lock()
			// A retried step reports its run again; that must not count.
			if !lastStep[in.Run] {
				lastStep[in.Run] = true
				if len(lastStep) == o.runs {
					close(allLast)
				}
			}
			mu.Unlock()
			return []byte(`{"ok":true}`), nil
		},
	}
	if err := p.serveActions(ctx, o, handlers); err != nil {
		return err
	}
	if _, _, err := p.client.CreateWorkflow(ctx, benchWorkflow); err != nil {
		return fmt.Errorf("create workflow: %w", err)
	}

	fmt.Printf("workflows: %d runs of a three-step workflow, %d starters, %d workers x %d slots, fsync=%v\n",
		o.runs, o.starters, o.workers, o.concurrency, o.fsync)
	stopProfile, err := profile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	start := time.Now()
	err = chunks(o.starters, o.runs, 1, func(lo, _ int) error {
		_, err := p.client.StartWorkflow(ctx, "bench", map[string]int{"n": lo}, flo.StartWorkflowOptions{})
		return err
	})
	if err != nil {
		return err
	}
	started := time.Since(start)
	select {
	case <-allLast:
	case <-ctx.Done():
		return ctx.Err()
	}
	var runs []*flo.Run
	err = waitFor(ctx, start, "runs completed", func() (int, int, error) {
		failed, err := listRuns(ctx, p.client, flo.RunFailed)
		if err != nil {
			return 0, 0, err
		}
		if len(failed) > 0 {
			return 0, 0, fmt.Errorf("%d runs failed, run %s: %s", len(failed), failed[0].ID, failed[0].Error)
		}
		runs, err = listRuns(ctx, p.client, flo.RunCompleted)
		return len(runs), o.runs, err
	})
	if err != nil {
		return err
	}

	// The clock stops when the last run finished, as the run reports it:
	// the bench's polling adds nothing.
	var lat latencies
	var last time.Time
	for _, r := range runs {
		lat.add(r.FinishedAt.Sub(r.CreatedAt))
		if r.FinishedAt.After(last) {
			last = r.FinishedAt
		}
	}
	elapsed := last.Sub(start)
	p50, p99, _ := lat.percentiles()
	fmt.Printf("  started in %v (%.0f starts/s); all completed in %v\n", started.Round(time.Millisecond),
		perSecond(o.runs, started), elapsed.Round(time.Millisecond))
	fmt.Printf("  throughput %.0f runs/s; start-to-complete p50 %v p99 %v\n", perSecond(o.runs, elapsed), p50, p99)
	return nil
}

// listRuns returns every run of the bench workflow in status st.
func listRuns(ctx context.Context, client *flo.Client, st flo.RunStatus) ([]*flo.Run, error) {
	var out []*flo.Run
	filter := flo.RunFilter{Workflow: "bench", Status: st, Limit: 1000}
	for {
		runs, next, err := client.ListRuns(ctx, filter)
		if err != nil {
			return nil, err
		}
		out = append(out, runs...)
		if next == "" {
			return out, nil
		}
		filter.PageToken = next
	}
}
