// Package telemetrytest reads what OpenTelemetry instruments recorded, for
// tests: a meter provider with a manual reader, private or installed as the
// global one for the length of a test.
package telemetrytest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Reader collects a meter provider's instruments on demand.
type Reader struct {
	t        testing.TB
	reader   *sdkmetric.ManualReader
	provider *sdkmetric.MeterProvider
}

// New returns a Reader with a meter provider of its own, shut down when the
// test ends.
func New(t testing.TB) *Reader {
	r := &Reader{t: t, reader: sdkmetric.NewManualReader()}
	r.provider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() { _ = r.provider.Shutdown(context.Background()) })
	return r
}

// Global returns a Reader whose provider is the global one until the test
// ends. Code that reports through the global provider cannot be told apart
// from other tests' doing the same, so such a test must not run in parallel.
func Global(t testing.TB) *Reader {
	r := New(t)
	otel.SetMeterProvider(r.provider)
	t.Cleanup(func() { otel.SetMeterProvider(noop.NewMeterProvider()) })
	return r
}

// Meter returns a meter of the Reader's provider.
func (r *Reader) Meter(name string) metric.Meter { return r.provider.Meter(name) }

// Series collects every instrument and returns the value of each int64 or
// float64 counter and gauge series, keyed by the instrument's name, a space
// and its attributes as "k=v,k=v" in key order ("name " without any).
func (r *Reader) Series() map[string]float64 {
	r.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		r.t.Fatalf("collect metrics: %v", err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				addPoints(out, m.Name, d.DataPoints)
			case metricdata.Sum[float64]:
				addPoints(out, m.Name, d.DataPoints)
			case metricdata.Gauge[int64]:
				addPoints(out, m.Name, d.DataPoints)
			case metricdata.Gauge[float64]:
				addPoints(out, m.Name, d.DataPoints)
			}
		}
	}
	return out
}

// Value collects every instrument and returns the value of the series of
// name with exactly attrs; ok is false when there is none.
func (r *Reader) Value(name string, attrs ...attribute.KeyValue) (v float64, ok bool) {
	r.t.Helper()
	v, ok = r.Series()[key(name, attribute.NewSet(attrs...))]
	return v, ok
}

// addPoints adds the points of instrument name to out, keyed as Series says.
func addPoints[N int64 | float64](out map[string]float64, name string, points []metricdata.DataPoint[N]) {
	for _, p := range points {
		out[key(name, p.Attributes)] = float64(p.Value)
	}
}

func key(name string, attrs attribute.Set) string {
	return name + " " + attrs.Encoded(attribute.DefaultEncoder())
}
