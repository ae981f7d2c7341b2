// Package service wires the streams service: Postgres pool and migrations,
// the broker client, the read cache and stream watchers, appends, range
// reads, consumer groups with coalesced acks, the dropped-topic sweeper, and
// the gRPC and HTTP servers, with an orderly graceful stop.
package service

import (
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
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/probe"
	"github.com/razorbill/flo/libs/stage"
	"github.com/razorbill/flo/libs/sweep"
	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/libs/wake"
	"github.com/razorbill/flo/services/streams/internal/appender"
	"github.com/razorbill/flo/services/streams/internal/catalog"
	"github.com/razorbill/flo/services/streams/internal/group"
	"github.com/razorbill/flo/services/streams/internal/grpcapi"
	"github.com/razorbill/flo/services/streams/internal/logread"
	"github.com/razorbill/flo/services/streams/internal/scan"
	"github.com/razorbill/flo/services/streams/internal/store"
	"github.com/razorbill/flo/services/streams/migrations"
)

// Schema is the streams service's Postgres schema.
const Schema = "streams"

// Bounds of the service.
const (
	grpcStopTimeout  = 10 * time.Second
	httpStopTimeout  = 5 * time.Second
	readyPingTimeout = time.Second
	// safetyTick probes one blocked read per group (or stream) now and then,
	// in case a wake-up was missed (a nack on another replica, say); a
	// probed read that finds records wakes the others of its group.
	safetyTick = time.Second
	// MaxRecordBytesLimit bounds FLO_STREAMS_MAX_RECORD_BYTES.
	MaxRecordBytesLimit = 16 << 20
)

// Config is the streams service's configuration, read from FLO_* variables.
type Config struct {
	GRPCAddr string `env:"FLO_STREAMS_GRPC_ADDR, default=:9103"`
	HTTPAddr string `env:"FLO_STREAMS_HTTP_ADDR, default=:9113"`
	// MaxRecordBytes is the largest record payload an append accepts.
	MaxRecordBytes int `env:"FLO_STREAMS_MAX_RECORD_BYTES, default=1048576"`
	// ReadCacheBytes bounds the recently appended and fetched records kept
	// decoded in memory; 0 turns the cache off.
	ReadCacheBytes int64 `env:"FLO_STREAMS_READ_CACHE_BYTES, default=67108864"`
	// MaxStreamsPerNamespace refuses creating a stream past this many in a
	// namespace (dead-letter streams aside). Zero means the default.
	MaxStreamsPerNamespace int `env:"FLO_MAX_STREAMS_PER_NAMESPACE, default=1000"`
	Postgres               config.Postgres
	Kafka                  config.Kafka
	Shutdown               config.Shutdown
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

// Service is a running streams service.
type Service struct {
	cfg Config
	log *slog.Logger

	pool    *pgxpool.Pool
	client  *kgo.Client
	watchCl *kgo.Client
	hub     *wake.Hub
	reader  *logread.Reader
	catalog *catalog.Catalog
	groups  *group.Groups
	gauges  *telemetry.Gauges

	grpcServer *grpc.Server
	grpcLis    net.Listener
	httpServer *http.Server
	httpLis    net.Listener

	stopping atomic.Bool
}

// New connects to Postgres (applying migrations) and the broker, and opens
// both listeners, so GRPCAddr and HTTPAddr are known before Run.
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
		return nil, fmt.Errorf("streams: %w", err)
	}
	if s.client, err = kafka.NewManagedTopicsClient(cfg.Kafka, appender.ClientOptions(cfg.MaxRecordBytes)...); err != nil {
		return nil, fmt.Errorf("streams: broker client: %w", err)
	}
	// Long polls get a client of their own: a broker answers a
	// connection's requests in order, so they would hold up reads.
	if s.watchCl, err = kafka.NewManagedTopicsClient(cfg.Kafka); err != nil {
		return nil, fmt.Errorf("streams: broker client: %w", err)
	}

	s.hub = wake.NewHub()
	// A stream's waiters are keyed by its topic: records beyond the known
	// end of the topic wake them.
	s.reader = logread.New(s.client, s.watchCl, logread.NewCache(cfg.ReadCacheBytes), func(topic string) { s.hub.Wake(topic) }, log)
	app := appender.New(s.client, s.reader, cfg.MaxRecordBytes)
	forget := func(st store.Stream) {
		s.reader.Forget(st.Topic())
		app.Forget(st.Topic(), st.Partitions)
		s.hub.Wake(st.Topic())
	}
	s.catalog = catalog.New(s.pool, s.client, s.reader, appender.TopicMaxMessageBytes(cfg.MaxRecordBytes), cfg.MaxStreamsPerNamespace, forget, log)
	meter := otel.Meter("github.com/razorbill/flo/services/streams")
	if s.groups, err = group.New(s.pool, s.catalog, s.reader, app, s.hub, log, meter); err != nil {
		return nil, fmt.Errorf("streams: %w", err)
	}
	if s.gauges, err = group.NewGauges(s.catalog, meter); err != nil {
		return nil, fmt.Errorf("streams: %w", err)
	}

	if s.grpcServer, err = grpcapi.NewGRPCServer(grpcapi.Deps{
		Catalog: s.catalog, Appender: app, Groups: s.groups,
		Scanner: scan.New(s.catalog, s.reader, s.hub, s.groups.Closing()), Log: log,
	}, cfg.Auth); err != nil {
		return nil, fmt.Errorf("streams: %w", err)
	}
	if s.grpcLis, s.httpLis, err = stage.Listen(cfg.GRPCAddr, cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("streams: %w", err)
	}
	s.httpServer = &http.Server{Handler: probe.Handler(s.ready(), o.metrics), ReadHeaderTimeout: 10 * time.Second}
	return s, nil
}

func validate(cfg Config) error {
	switch {
	case cfg.Postgres.URL == "":
		return errors.New("streams: FLO_DATABASE_URL is required")
	case len(cfg.Kafka.Brokers) == 0:
		return errors.New("streams: FLO_KAFKA_BROKERS is required")
	case cfg.MaxRecordBytes <= 0 || cfg.MaxRecordBytes > MaxRecordBytesLimit:
		return fmt.Errorf("streams: FLO_STREAMS_MAX_RECORD_BYTES must be between 1 and %d, got %d", MaxRecordBytesLimit, cfg.MaxRecordBytes)
	case cfg.ReadCacheBytes < 0:
		return fmt.Errorf("streams: FLO_STREAMS_READ_CACHE_BYTES must not be negative, got %d", cfg.ReadCacheBytes)
	}
	if err := internalauth.Validate(cfg.Auth); err != nil {
		return fmt.Errorf("streams: %w", err)
	}
	return nil
}

// GRPCAddr is the address the gRPC server listens on.
func (s *Service) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the address of /healthz, /readyz and /metrics.
func (s *Service) HTTPAddr() string { return s.httpLis.Addr().String() }

// Run serves until ctx ends or a component fails, then stops in order:
// readiness off (serving on for Shutdown.Delay), blocked reads answered
// (empty), gRPC drained, coalesced acks settled, background work stopped, HTTP
// stopped and connections closed. Appends return only once the broker has the
// records and group reads and acks commit in one transaction, so stopping at
// any point loses nothing: records handed out and not acked are redelivered
// later.
func (s *Service) Run(ctx context.Context) error {
	err := stage.Run(ctx, s.log,
		stage.HTTP(s.httpServer, s.httpLis, httpStopTimeout, s.log),
		stage.New("work").
			Go("wake hub", func(ctx context.Context) error { return s.hub.RunProbing(ctx, safetyTick) }).
			Go("stream watcher", s.reader.Run).
			Go("settler", s.groups.Run).
			Go("group gauges", s.gauges.Run).
			Go("topic sweeper", func(ctx context.Context) error {
				return sweep.Every(ctx, catalog.SweepInterval, s.log, "delete topics of deleted streams", s.catalog.Sweep)
			}),
		stage.GRPC(s.grpcServer, s.grpcLis, grpcStopTimeout, s.log),
		stage.New("reads").OnStop(func(context.Context) { s.groups.Close() }),
		stage.Readiness(s.cfg.Shutdown.Delay, func() { s.stopping.Store(true) }, s.log),
	)
	s.closeResources()
	return err
}

// closeResources closes the listeners (if the servers did not), the broker
// clients and the pool.
func (s *Service) closeResources() {
	for _, l := range []net.Listener{s.grpcLis, s.httpLis} {
		if l != nil {
			_ = l.Close()
		}
	}
	for _, cl := range []*kgo.Client{s.client, s.watchCl} {
		if cl != nil {
			cl.Close()
		}
	}
	if s.pool != nil {
		s.pool.Close()
	}
}

// ready reports whether the service can do its work: not stopping and the
// database answering. The broker is not checked: reads and appends wait for
// it a while, and a replica that cannot reach it cannot help by restarting.
func (s *Service) ready() func(context.Context) error {
	return probe.All(probe.Unset(&s.stopping, "stopping"), probe.Ping("database", s.pool, readyPingTimeout))
}
