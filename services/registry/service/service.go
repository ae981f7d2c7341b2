// Package service wires the registry: Postgres pool and migrations, the
// task-event consumer, the health check, the outbox relay, and the gRPC and
// HTTP servers, with an orderly graceful stop.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/internalauth"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/probe"
	"github.com/razorbill/flo/libs/stage"
	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/services/registry/internal/grpcapi"
	"github.com/razorbill/flo/services/registry/internal/health"
	"github.com/razorbill/flo/services/registry/internal/roster"
	"github.com/razorbill/flo/services/registry/internal/tally"
	"github.com/razorbill/flo/services/registry/migrations"
)

// Schema is the registry's Postgres schema.
const Schema = "registry"

// Shutdown bounds.
const (
	grpcStopTimeout  = 10 * time.Second
	relayFlushWait   = 5 * time.Second
	httpStopTimeout  = 5 * time.Second
	readyPingTimeout = time.Second
)

// Config is the registry's configuration, read from FLO_* variables.
type Config struct {
	GRPCAddr string `env:"FLO_REGISTRY_GRPC_ADDR, default=:9102"`
	HTTPAddr string `env:"FLO_REGISTRY_HTTP_ADDR, default=:9112"`
	// HeartbeatTimeout is how long a worker may stay silent before it is
	// marked unhealthy.
	HeartbeatTimeout time.Duration `env:"FLO_WORKER_HEARTBEAT_TIMEOUT, default=90s"`
	// HealthCheckInterval is how often each replica looks for silent workers.
	HealthCheckInterval time.Duration `env:"FLO_WORKER_HEALTH_CHECK_INTERVAL, default=5s"`
	// MaxWorkersPerNamespace refuses registrations past this many workers.
	MaxWorkersPerNamespace int `env:"FLO_MAX_WORKERS_PER_NAMESPACE, default=10000"`
	// MaxPayloadBytes is the platform's payload limit; the producer is sized
	// for it like every service's. Zero means the default.
	MaxPayloadBytes int `env:"FLO_MAX_PAYLOAD_BYTES, default=1048576"`
	Postgres        config.Postgres
	Kafka           config.Kafka
	Shutdown        config.Shutdown
	// Auth is the internal credential its gRPC server requires and its
	// clients of other services carry.
	Auth config.Auth
}

// Option adjusts a Service.
type Option func(*options)

type options struct {
	metrics http.Handler
}

// WithMetricsHandler serves h at /metrics, typically the handler of the
// process's telemetry.Setup. Without it /metrics is not served.
func WithMetricsHandler(h http.Handler) Option {
	return func(o *options) { o.metrics = h }
}

// Service is a running registry.
type Service struct {
	cfg Config
	log *slog.Logger

	pool     *pgxpool.Pool
	producer *kgo.Client
	consumer *kafka.Consumer
	relay    *outbox.Relay
	roster   *roster.Roster
	checker  *health.Checker
	tally    *tally.Tally
	gauges   *telemetry.Gauges

	grpcServer *grpc.Server
	grpcLis    net.Listener
	httpServer *http.Server
	httpLis    net.Listener

	consuming atomic.Bool
	stopping  atomic.Bool
}

// New connects to Postgres (applying migrations) and the broker (creating
// the topics it uses), and opens both listeners, so GRPCAddr and HTTPAddr are
// known before Run.
func New(ctx context.Context, cfg Config, log *slog.Logger, opts ...Option) (_ *Service, err error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := validate(cfg); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			s.closeResources()
		}
	}()

	if s.pool, err = pg.Open(ctx, cfg.Postgres.URL, Schema, cfg.Postgres.MaxConns, migrations.FS, log); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	if s.producer, err = kafka.NewProducer(ctx, cfg.Kafka, cfg.Kafka.Partitions, cmp.Or(cfg.MaxPayloadBytes, config.DefaultMaxPayloadBytes),
		[]string{kafka.WorkerEventsTopic, kafka.TaskOutcomesTopic}); err != nil {
		return nil, fmt.Errorf("registry: producer: %w", err)
	}
	s.relay = outbox.NewRelay(s.pool, s.producer, log)

	meter := otel.Meter("github.com/razorbill/flo/services/registry")
	if s.roster, err = roster.New(s.pool, s.relay, cfg.MaxWorkersPerNamespace, cfg.HeartbeatTimeout, meter); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	if s.checker, err = health.New(s.pool, s.relay, cfg.HeartbeatTimeout, log, meter); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	if s.tally, err = tally.New(s.pool, meter); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	if s.gauges, err = roster.NewGauges(s.pool, meter); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}

	if s.grpcServer, err = grpcapi.NewGRPCServer(s.roster, log, cfg.Auth); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	if s.grpcLis, s.httpLis, err = stage.Listen(cfg.GRPCAddr, cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	s.httpServer = &http.Server{Handler: probe.Handler(s.ready(), o.metrics), ReadHeaderTimeout: 10 * time.Second}
	// Last, because a consumer's client is only released by its Run.
	if s.consumer, err = kafka.NewConsumer(cfg.Kafka, tally.ConsumerGroup, []string{kafka.TaskOutcomesTopic}, s.tally.HandleRecords, log,
		// Counters need no haste: under load, fewer and larger batches
		// make fewer fetches and fewer transactions for the same events.
		kgo.FetchMinBytes(tally.FetchMinBytes), kgo.FetchMaxWait(tally.FetchMaxWait)); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	// Dispatchers of earlier versions wrote outcomes only into the task
	// events, which this service's earlier versions read.
	s.consumer.TakeOverTaskOutcomes()
	return s, nil
}

func validate(cfg Config) error {
	switch {
	case cfg.Postgres.URL == "":
		return errors.New("registry: FLO_DATABASE_URL is required")
	case len(cfg.Kafka.Brokers) == 0:
		return errors.New("registry: FLO_KAFKA_BROKERS is required")
	case cfg.HeartbeatTimeout <= 0:
		return fmt.Errorf("registry: FLO_WORKER_HEARTBEAT_TIMEOUT must be positive, got %s", cfg.HeartbeatTimeout)
	case cfg.HealthCheckInterval <= 0:
		return fmt.Errorf("registry: FLO_WORKER_HEALTH_CHECK_INTERVAL must be positive, got %s", cfg.HealthCheckInterval)
	case cfg.MaxWorkersPerNamespace <= 0:
		return fmt.Errorf("registry: FLO_MAX_WORKERS_PER_NAMESPACE must be positive, got %d", cfg.MaxWorkersPerNamespace)
	}
	if err := internalauth.Validate(cfg.Auth); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	return nil
}

// GRPCAddr is the address the gRPC server listens on.
func (s *Service) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the address of /healthz, /readyz and /metrics.
func (s *Service) HTTPAddr() string { return s.httpLis.Addr().String() }

// Run serves until ctx ends or a component fails, then stops in order:
// readiness off (serving on for Shutdown.Delay), gRPC drained, the consumer
// stopped (committing what it handled), the health check stopped, the outbox
// flushed, HTTP stopped and connections closed. Every change is committed with
// its outbox rows, so stopping at any point loses nothing.
func (s *Service) Run(ctx context.Context) error {
	s.consuming.Store(true)
	err := stage.Run(ctx, s.log,
		stage.HTTP(s.httpServer, s.httpLis, httpStopTimeout, s.log),
		stage.New("relay").
			Go("outbox relay", s.relay.Run).
			OnStop(s.relay.FlushAtStop(relayFlushWait)),
		stage.New("work").
			Go("registration and heartbeat batches", s.roster.Run).
			Go("health check", func(ctx context.Context) error { return s.checker.Run(ctx, s.cfg.HealthCheckInterval) }).
			Go("worker gauges", s.gauges.Run).
			// Stopped after the consumer, whose last batches it applies.
			Go("task event counts", s.tally.Run),
		stage.New("consumer").Go("task outcomes consumer", func(ctx context.Context) error {
			defer s.consuming.Store(false)
			return s.consumer.Run(ctx)
		}),
		stage.GRPC(s.grpcServer, s.grpcLis, grpcStopTimeout, s.log),
		stage.Readiness(s.cfg.Shutdown.Delay, func() { s.stopping.Store(true) }, s.log),
	)
	s.closeResources()
	return err
}

// closeResources closes the listeners (if the servers did not), the
// producer and the pool.
func (s *Service) closeResources() {
	for _, l := range []net.Listener{s.grpcLis, s.httpLis} {
		if l != nil {
			_ = l.Close()
		}
	}
	if s.producer != nil {
		s.producer.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
}

// ready reports whether the registry can do its work: not stopping, the
// database answering and the task-outcomes consumer running.
func (s *Service) ready() func(context.Context) error {
	return probe.All(probe.Unset(&s.stopping, "stopping"), probe.Set(&s.consuming, "task outcomes consumer not running"), func(ctx context.Context) error { return s.consumer.HandedOver(ctx) }, probe.Ping("database", s.pool, readyPingTimeout))
}
