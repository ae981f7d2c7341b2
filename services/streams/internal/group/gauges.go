package group

import (
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/services/streams/internal/catalog"
)

// NewGauges returns the gauges of every group's lag (records not handed out
// yet) and pending records (handed out, not settled). A collection costs one
// query and two offset requests, at most once per telemetry.GaugeMaxAge;
// every replica reports the same values. They report while the result's Run
// runs.
func NewGauges(cat *catalog.Catalog, meter metric.Meter) (*telemetry.Gauges, error) {
	lag, err := meter.Int64ObservableGauge("flo.streams.group.lag", metric.WithUnit("{record}"),
		metric.WithDescription("Records of the stream not handed to the group yet."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	pending, err := meter.Int64ObservableGauge("flo.streams.group.pending", metric.WithUnit("{record}"),
		metric.WithDescription("Records handed to the group's consumers and not acked, nacked or dead-lettered yet."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	return telemetry.NewGauges(meter, telemetry.GaugeMaxAge, cat.AllGroups, func(groups []catalog.GroupInfo, o metric.Observer) {
		for _, gi := range groups {
			attrs := metric.WithAttributes(attribute.String("namespace", gi.Namespace),
				attribute.String("stream", gi.Stream), attribute.String("group", gi.Group.Name))
			o.ObserveInt64(lag, gi.Lag, attrs)
			o.ObserveInt64(pending, gi.Pending, attrs)
		}
	}, lag, pending), nil
}
