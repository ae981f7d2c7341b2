package roster

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/services/registry/internal/store"
)

// statuses and types are every value a worker can have, so a namespace with
// workers reports zero for the others instead of series that come and go.
var (
	statuses = []store.Status{store.Active, store.Idle, store.Draining, store.Unhealthy}
	types    = []store.Type{store.ActionWorker, store.StreamWorker}
)

// NewGauges returns the gauge of how many workers each namespace has, by
// type and status: one grouped query per collection, at most once per
// telemetry.GaugeMaxAge. Every replica reports the same values. It reports
// while the result's Run runs.
func NewGauges(pool *pgxpool.Pool, meter metric.Meter) (*telemetry.Gauges, error) {
	workers, err := meter.Int64ObservableGauge("flo.workers", metric.WithUnit("{worker}"),
		metric.WithDescription("Registered workers by namespace, type (action, stream) and status (active, idle, draining, unhealthy)."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	load := func(ctx context.Context) ([]store.StatusCount, error) { return store.CountWorkers(ctx, pool) }
	return telemetry.NewGauges(meter, telemetry.GaugeMaxAge, load, func(counts []store.StatusCount, o metric.Observer) {
		type key struct {
			typ    store.Type
			status store.Status
		}
		byNamespace := map[string]map[key]int64{}
		for _, c := range counts {
			if byNamespace[c.Namespace] == nil {
				byNamespace[c.Namespace] = map[key]int64{}
			}
			byNamespace[c.Namespace][key{c.Type, c.Status}] = c.Workers
		}
		for ns, n := range byNamespace {
			for _, typ := range types {
				for _, status := range statuses {
					o.ObserveInt64(workers, n[key{typ, status}], metric.WithAttributes(
						attribute.String("namespace", ns), attribute.String("type", string(typ)), attribute.String("status", string(status))))
				}
			}
		}
	}, workers), nil
}
