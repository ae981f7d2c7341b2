// Package telemetry installs OpenTelemetry tracing and metrics for a service:
// spans are exported over OTLP/gRPC only when an OTLP endpoint is
// configured; while nothing records them, only spans without a parent are
// made (so every request's trace id reaches the logs) and the others pass
// their parent's context on (see passthroughProvider); metrics are served in
// the Prometheus format.
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
	once       sync.Once
	p          *providers
	processors []sdktrace.SpanProcessor
}

// providers are shared by every Telemetry of the process, because the otel
// globals they are installed in exist once per process.
type providers struct {
	// exporter sends spans over OTLP; nil without an endpoint.
	exporter sdktrace.SpanProcessor
	meter    *sdkmetric.MeterProvider
	handler  http.Handler
	users    int
}

var (
	mu     sync.Mutex
	shared *providers
	// tracer is the process's one tracer provider. It is installed once and
	// never replaced: tracers taken from the otel globals before it was
	// installed (package-level ones) stay bound to the first provider set, so
	// a replacement would silence them. Exporters come and go with shared.
	tracer *sdktrace.TracerProvider
)

// Option adjusts a Setup.
type Option func(*Telemetry)

// WithSpanProcessor adds sp to the process's tracer provider until this
// Telemetry is shut down, which shuts sp down too. Tests pass a
// tracetest.SpanRecorder to see every span the process records.
func WithSpanProcessor(sp sdktrace.SpanProcessor) Option {
	return func(t *Telemetry) { t.processors = append(t.processors, sp) }
}

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
// first service's name) until every Telemetry has been shut down. The tracer
// provider itself stays for the life of the process; what Shutdown flushes and
// removes are its exporter and span processors.
func Setup(ctx context.Context, service string, opts ...Option) (*Telemetry, error) {
	mu.Lock()
	defer mu.Unlock()
	if shared == nil {
		p, err := newProviders(ctx, service)
		if err != nil {
			return nil, err
		}
		shared = p
		otel.SetMeterProvider(p.meter)
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	}
	shared.users++
	t := &Telemetry{p: shared}
	for _, opt := range opts {
		opt(t)
	}
	for _, sp := range t.processors {
		tracer.RegisterSpanProcessor(sp)
		registered.Add(1)
	}
	return t, nil
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

	var exporter sdktrace.SpanProcessor
	if otlpConfigured() {
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		exporter = sdktrace.NewBatchSpanProcessor(exp)
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
	if tracer == nil {
		tracer = sdktrace.NewTracerProvider(sdktrace.WithResource(res))
		otel.SetTracerProvider(&passthroughProvider{sdk: tracer})
	}
	if exporter != nil {
		tracer.RegisterSpanProcessor(exporter)
		registered.Add(1)
	}
	return &providers{
		exporter: exporter,
		meter:    sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res)),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
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

// Shutdown flushes and removes this handle's span processors, and flushes
// and stops the exporters and the meter provider once the last Telemetry of
// the process is shut down; earlier calls release only this handle. Calling
// it twice does nothing more.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var err error
	t.once.Do(func() {
		mu.Lock()
		defer mu.Unlock()
		processors := t.processors
		t.p.users--
		if t.p.users == 0 {
			if shared == t.p {
				shared = nil
			}
			if t.p.exporter != nil {
				processors = append(processors, t.p.exporter)
			}
			err = t.p.meter.Shutdown(ctx)
		}
		for _, sp := range processors {
			// Shut down first, within ctx: unregistering shuts down too,
			// but without a deadline.
			err = errors.Join(err, sp.Shutdown(ctx))
			tracer.UnregisterSpanProcessor(sp)
			registered.Add(-1)
		}
		if err != nil {
			err = fmt.Errorf("shutdown telemetry: %w", err)
		}
	})
	return err
}
