package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	flo "github.com/razorbill/flo-go"
)

// benchWorkflow is three steps, each a trivial action. The last step is
// given the run id and the time its start was called (the run input's
// "at", Unix nanoseconds), so the bench learns without asking that a run
// has reached its last action, and how long that took.
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
    inputMapping: '{"run": "$.flo.run_id", "at": "$.input.at"}'
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// answerOK is the bench workflow's steps' handler: a trivial success.
func answerOK(*flo.ActionContext) ([]byte, error) { return []byte(`{"ok":true}`), nil }

// runInput is what each bench run is started with; at is when its start
// was called, in Unix nanoseconds.
type runInput struct {
	N  int   `json:"n"`
	At int64 `json:"at"`
}

// lastStepInput is what benchWorkflow's last step is given.
type lastStepInput struct {
	Run string `json:"run"`
	At  int64  `json:"at"`
}

// benchWorkflows starts o.runs runs of benchWorkflow from o.starters
// goroutines, waits for all of them to complete, and prints runs/s and the
// start-to-complete latency the runs themselves report (created_at to
// finished_at). With o.sustain it runs benchWorkflowsSustained.
func benchWorkflows(ctx context.Context, p *platform, o options) error {
	if o.sustain > 0 {
		return benchWorkflowsSustained(ctx, p, o)
	}
	last := newLastSteps()
	handlers := map[string]actionHandler{
		"bench-first":  answerOK,
		"bench-second": answerOK,
		"bench-third":  last.handler,
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
	m, err := measureRuns(ctx, p, o, "bench", last)
	if err != nil {
		return err
	}
	m.print("")
	return nil
}

// lastSteps learns from the runs' last action, without asking the service,
// that every run of a phase has reached it: the action is given the run id.
type lastSteps struct {
	mu   sync.Mutex
	seen map[string]bool
	want int
	all  chan struct{}
}

func newLastSteps() *lastSteps { return &lastSteps{seen: map[string]bool{}, all: make(chan struct{})} }

// expect starts a phase of want runs.
func (l *lastSteps) expect(want int) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen, l.want, l.all = map[string]bool{}, want, make(chan struct{})
	return l.all
}

func (l *lastSteps) handler(actx *flo.ActionContext) ([]byte, error) {
	var in lastStepInput
	if err := actx.Into(&in); err != nil {
		return nil, flo.NewNonRetryableErrorf("bad input: %v", err)
	}
	l.mu.Lock()
	// A retried step reports its run again; that must not count.
	if !l.seen[in.Run] {
		l.seen[in.Run] = true
		if len(l.seen) == l.want {
			close(l.all)
		}
	}
	l.mu.Unlock()
	return answerOK(actx)
}

// runsMeasure is one phase's result.
type runsMeasure struct {
	runs             int
	started, elapsed time.Duration
	p50, p99         time.Duration
	usage            usage
}

func (m runsMeasure) print(label string) {
	fmt.Printf("  %sstarted in %v (%.0f starts/s); all completed in %v\n", label, m.started.Round(time.Millisecond),
		perSecond(m.runs, m.started), m.elapsed.Round(time.Millisecond))
	fmt.Printf("  %sthroughput %.0f runs/s; start-to-complete p50 %v p99 %v\n", label, perSecond(m.runs, m.elapsed), m.p50, m.p99)
	fmt.Printf("  %sper 1000 runs until the last step started: process CPU %s ms, Postgres CPU %s ms, Postgres commits %d\n", label,
		perThousand(m.usage.cpu, int64(m.runs)), perThousand(m.usage.pgCPU, int64(m.runs)), m.usage.commits*1000/int64(m.runs))
}

// measureRuns starts o.runs runs of workflow from o.starters goroutines and
// waits until they all completed; the clock stops when the last run
// finished, as the run reports it, so the bench's polling adds nothing.
func measureRuns(ctx context.Context, p *platform, o options, workflow string, last *lastSteps) (runsMeasure, error) {
	db, err := p.openDB(ctx)
	if err != nil {
		return runsMeasure{}, err
	}
	defer db.Close(context.Background())
	pgPID, err := postmaster(ctx, db)
	if err != nil {
		return runsMeasure{}, err
	}
	before, err := readUsage(ctx, db, pgPID)
	if err != nil {
		return runsMeasure{}, err
	}
	allLast := last.expect(o.runs)
	start := time.Now()
	err = chunks(o.starters, o.runs, 1, func(lo, _ int) error {
		_, err := p.client.StartWorkflow(ctx, workflow, runInput{N: lo, At: time.Now().UnixNano()}, flo.StartWorkflowOptions{})
		return err
	})
	if err != nil {
		return runsMeasure{}, err
	}
	m := runsMeasure{runs: o.runs, started: time.Since(start)}
	select {
	case <-allLast:
	case <-ctx.Done():
		return runsMeasure{}, ctx.Err()
	}
	// The last steps have started; what the runs' last reports cost is
	// left out, against what listing them below would add.
	after, err := readUsage(ctx, db, pgPID)
	if err != nil {
		return runsMeasure{}, err
	}
	m.usage = after.sub(before)
	var runs []*flo.Run
	err = waitFor(ctx, start, "runs completed", func() (int, int, error) {
		failed, err := listRuns(ctx, p.client, workflow, flo.RunFailed)
		if err != nil {
			return 0, 0, err
		}
		if len(failed) > 0 {
			return 0, 0, fmt.Errorf("%d runs failed, run %s: %s", len(failed), failed[0].ID, failed[0].Error)
		}
		all, err := listRuns(ctx, p.client, workflow, flo.RunCompleted)
		runs = nil
		for _, r := range all {
			if !r.CreatedAt.Before(start) {
				runs = append(runs, r)
			}
		}
		return len(runs), o.runs, err
	})
	if err != nil {
		return runsMeasure{}, err
	}
	var lat latencies
	var lastEnd time.Time
	for _, r := range runs {
		lat.add(r.FinishedAt.Sub(r.CreatedAt))
		if r.FinishedAt.After(lastEnd) {
			lastEnd = r.FinishedAt
		}
	}
	m.elapsed = lastEnd.Sub(start)
	m.p50, m.p99, _ = lat.percentiles()
	return m, nil
}

// listRuns returns every run of workflow in status st.
func listRuns(ctx context.Context, client *flo.Client, workflow string, st flo.RunStatus) ([]*flo.Run, error) {
	var out []*flo.Run
	filter := flo.RunFilter{Workflow: workflow, Status: st, Limit: 1000}
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

// benchWorkflowsSustained runs the workflows mode for a steady rate
// (runSustained): runs of benchWorkflow started by o.starters goroutines,
// each measured when its last step's handler starts, from the moment its
// start was called. A run costs three tasks.
func benchWorkflowsSustained(ctx context.Context, p *platform, o options) error {
	return runSustained(ctx, p, o, func(s *sustained) (workload, error) {
		err := p.serveActions(ctx, o, map[string]actionHandler{
			"bench-first":  answerOK,
			"bench-second": answerOK,
			"bench-third": func(actx *flo.ActionContext) ([]byte, error) {
				now := time.Now()
				var in lastStepInput
				if err := actx.Into(&in); err != nil {
					return nil, flo.NewNonRetryableErrorf("bad input: %v", err)
				}
				s.arrived(in.At, now)
				return answerOK(actx)
			},
		})
		if err != nil {
			return workload{}, err
		}
		if _, _, err := p.client.CreateWorkflow(ctx, benchWorkflow); err != nil {
			return workload{}, fmt.Errorf("create workflow: %w", err)
		}
		inv := &invoker{mode: "StartWorkflow", per: 1, invoke: func(ctx context.Context, _ int) error {
			if _, err := p.client.StartWorkflow(ctx, "bench", runInput{At: time.Now().UnixNano()}, flo.StartWorkflowOptions{}); err != nil {
				return fmt.Errorf("start workflow: %w", err)
			}
			return nil
		}}
		return workload{unit: "runs", latency: "start-to-last-step", tasks: 3, callers: o.starters, inv: inv}, nil
	})
}
