// Package telemetry installs OpenTelemetry tracing and metrics for a service:
// spans are always created (so trace ids reach logs and log records), they are
// exported over OTLP/gRPC only when an OTLP endpoint is configured, and
// metrics are served in the Prometheus format.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Telemetry is a handle on the process's telemetry providers.
type Telemetry struct {
	once sync.Once
	p    *providers
}

// providers are shared by every Telemetry of the process, because the otel
// globals they are installed in exist once per process.
type providers struct {
	tracer  *sdktrace.TracerProvider
	meter   *sdkmetric.MeterProvider
	handler http.Handler
	users   int
}

var (
	mu     sync.Mutex
	shared *providers
)

// Setup installs the global OpenTelemetry tracer and meter providers and the
// W3C tracecontext+baggage propagator, with service as service.name (unless
// OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES say otherwise). Spans are
// exported over OTLP/gRPC only when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (the exporter reads the other
// OTEL_EXPORTER_OTLP_* variables itself). Metrics go to a Prometheus registry
// private to this package, served by MetricsHandler.
//
// Several services can run in one process (`flo dev`): the first Setup
// installs the globals and later calls share them (so their spans carry the
// first service's name) until every Telemetry has been shut down.
func Setup(ctx context.Context, service string) (*Telemetry, error) {
	mu.Lock()
	defer mu.Unlock()
	if shared == nil {
		p, err := newProviders(ctx, service)
		if err != nil {
			return nil, err
		}
		shared = p
		otel.SetTracerProvider(p.tracer)
		otel.SetMeterProvider(p.meter)
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	}
	shared.users++
	return &Telemetry{p: shared}, nil
}

func newProviders(ctx context.Context, service string) (*providers, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}

	traceOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if otlpConfigured() {
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		traceOpts = append(traceOpts, sdktrace.WithBatcher(exp))
	}

	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("register go metrics: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("register process metrics: %w", err)
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	return &providers{
		tracer:  sdktrace.NewTracerProvider(traceOpts...),
		meter:   sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res)),
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}, nil
}

// otlpConfigured reports whether an OTLP endpoint is set. These are the
// standard OpenTelemetry variables, read by the exporter itself; we only
// check for them so that a laptop without a collector exports nothing.
func otlpConfigured() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// MetricsHandler serves the metrics in the Prometheus text format (mount it
// at /metrics).
func (t *Telemetry) MetricsHandler() http.Handler { return t.p.handler }

// Shutdown flushes and stops the providers once the last Telemetry of the
// process is shut down; earlier calls only release this handle. Calling it
// twice does nothing more.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var err error
	t.once.Do(func() {
		mu.Lock()
		defer mu.Unlock()
		t.p.users--
		if t.p.users > 0 {
			return
		}
		if shared == t.p {
			shared = nil
		}
		err = errors.Join(t.p.tracer.Shutdown(ctx), t.p.meter.Shutdown(ctx))
		if err != nil {
			err = fmt.Errorf("shutdown telemetry: %w", err)
		}
	})
	return err
}
