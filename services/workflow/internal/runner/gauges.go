package runner

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// runGaugeMaxAge is how long run counts are reused. Counting reads the whole
// runs table, which keeps every finished run, so it is asked less often
// than the other gauges' indexed queries.
const runGaugeMaxAge = 3 * telemetry.GaugeMaxAge

// runStatuses are every status a run can have, so a workflow with runs
// reports zero for the others instead of series that come and go.
var runStatuses = []engine.Status{
	engine.StatusPending, engine.StatusRunning, engine.StatusWaiting,
	engine.StatusCompleted, engine.StatusFailed, engine.StatusCancelled, engine.StatusTimedOut,
}

// NewGauges returns the gauge of how many runs each workflow has in each
// status: one grouped query per collection, at most once per
// runGaugeMaxAge. Every replica reports the same values. It reports while
// the result's Run runs.
func NewGauges(pool *pgxpool.Pool, meter metric.Meter) (*telemetry.Gauges, error) {
	runs, err := meter.Int64ObservableGauge("flo.workflow.runs", metric.WithUnit("{run}"),
		metric.WithDescription("Workflow runs by namespace, workflow and status, finished runs included."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	load := func(ctx context.Context) ([]store.RunCount, error) { return store.CountRuns(ctx, pool) }
	return telemetry.NewGauges(meter, runGaugeMaxAge, load, func(counts []store.RunCount, o metric.Observer) {
		type workflow struct{ namespace, name string }
		byWorkflow := map[workflow]map[engine.Status]int64{}
		for _, c := range counts {
			w := workflow{c.Namespace, c.Workflow}
			if byWorkflow[w] == nil {
				byWorkflow[w] = map[engine.Status]int64{}
			}
			byWorkflow[w][c.Status] = c.Runs
		}
		for w, n := range byWorkflow {
			for _, status := range runStatuses {
				o.ObserveInt64(runs, n[status], metric.WithAttributes(
					attribute.String("namespace", w.namespace), attribute.String("workflow", w.name), attribute.String("status", string(status))))
			}
		}
	}, runs), nil
}
