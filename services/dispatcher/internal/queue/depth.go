package queue

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// NewGauges returns the gauges of every action's queue: ready and delayed
// tasks and the age of the oldest ready one. A collection costs one query,
// at most once per telemetry.GaugeMaxAge however often /metrics is scraped;
// nothing is counted per task. Every replica reports the same cluster-wide
// values. They report while the result's Run runs.
func NewGauges(pool *pgxpool.Pool, meter metric.Meter) (*telemetry.Gauges, error) {
	ready, err := meter.Int64ObservableGauge("flo.tasks.queue.depth", metric.WithUnit("{task}"),
		metric.WithDescription("Queued tasks that can be claimed now."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	delayed, err := meter.Int64ObservableGauge("flo.tasks.queue.delayed", metric.WithUnit("{task}"),
		metric.WithDescription("Queued tasks waiting for their run time: retries in backoff and delayed invocations."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	oldest, err := meter.Float64ObservableGauge("flo.tasks.queue.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("How long the longest-waiting claimable task has been claimable; 0 when none is."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	load := func(ctx context.Context) ([]store.QueueDepth, error) { return store.QueueDepths(ctx, pool) }
	return telemetry.NewGauges(meter, telemetry.GaugeMaxAge, load, func(depths []store.QueueDepth, o metric.Observer) {
		for _, d := range depths {
			attrs := metric.WithAttributes(attribute.String("namespace", d.Namespace), attribute.String("action", d.Action))
			o.ObserveInt64(ready, d.Ready, attrs)
			o.ObserveInt64(delayed, d.Delayed, attrs)
			o.ObserveFloat64(oldest, d.OldestReady.Seconds(), attrs)
		}
	}, ready, delayed, oldest), nil
}
