// Package service wires the dispatcher: Postgres pool and migrations, the
// catalog, the replica's share of the task partitions (package owner) and its
// view, and the gRPC and HTTP servers, with an orderly graceful stop.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/internalauth"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/probe"
	"github.com/razorbill/flo/libs/stage"
	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/libs/wake"
	"github.com/razorbill/flo/services/dispatcher/internal/apikey"
	"github.com/razorbill/flo/services/dispatcher/internal/catalog"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/grpcapi"
	"github.com/razorbill/flo/services/dispatcher/internal/owner"
	"github.com/razorbill/flo/services/dispatcher/internal/queue"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/migrations"
)

// Schema is the dispatcher's Postgres schema.
const Schema = "dispatcher"

// Shutdown bounds.
const (
	grpcStopTimeout  = 10 * time.Second
	httpStopTimeout  = 5 * time.Second
	readyPingTimeout = time.Second
)

// Config is the dispatcher's configuration, read from FLO_* variables.
type Config struct {
	GRPCAddr string `env:"FLO_DISPATCHER_GRPC_ADDR, default=:9101"`
	HTTPAddr string `env:"FLO_DISPATCHER_HTTP_ADDR, default=:9111"`
	// AdvertiseAddr is the gRPC address other replicas and the gateways
	// reach this replica at; empty means the listener's, with an
	// unspecified host replaced by the host name.
	AdvertiseAddr string `env:"FLO_DISPATCHER_ADVERTISE_ADDR"`
	// ServiceAddr is the address the cluster reaches dispatcher replicas at
	// (a Service name). Calls to a peer's advertised address carry its
	// host as their authority, so internal TLS certificates issued for the
	// Service verify at pod addresses; empty means the peer's own address.
	ServiceAddr         string   `env:"FLO_DISPATCHER_ADDR"`
	BootstrapNamespaces []string `env:"FLO_BOOTSTRAP_NAMESPACES, default=default"`
	// MaxPayloadBytes is the platform's payload limit, which bounds the
	// results task events carry; the producer is sized for it. Zero means
	// the default.
	MaxPayloadBytes int `env:"FLO_MAX_PAYLOAD_BYTES, default=1048576"`
	// MaxActionsPerNamespace refuses registering a new action past this
	// many in a namespace. Zero means the default.
	MaxActionsPerNamespace int `env:"FLO_MAX_ACTIONS_PER_NAMESPACE, default=10000"`
	// PayloadMemory bounds the bytes of task payloads each owned partition
	// keeps in memory; past it, payloads the view has are read from it when
	// their tasks are claimed. 32 MiB: a replica owning all 8 default
	// partitions holds at most 256 MiB of payloads, within a 1 GiB pod.
	PayloadMemory int64 `env:"FLO_DISPATCH_PAYLOAD_MEMORY, default=33554432"`
	// HotHorizon: a queued task due later than this keeps its payload only
	// in the view until it is claimed.
	HotHorizon time.Duration `env:"FLO_DISPATCH_HOT_HORIZON, default=1m"`
	// QueuedTasks bounds the queued tasks each owned partition holds whole;
	// past it the last in hand-out order are kept only in the view, nothing
	// of them in memory, and read back as the partition's queue drains.
	// 20,000: a replica owning all 8 default partitions holds about 185 MB
	// of queued tasks (1.15 KB each) besides their payloads.
	QueuedTasks int `env:"FLO_DISPATCH_QUEUED_TASKS, default=20000"`
	Postgres    config.Postgres
	Kafka       config.Kafka
	Shutdown    config.Shutdown
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

// Service is a running dispatcher.
type Service struct {
	cfg Config
	log *slog.Logger

	pool     *pgxpool.Pool
	listener *wake.Listener
	replica  *owner.Replica
	peers    *owner.Peers
	gauges   *telemetry.Gauges

	grpcServer *grpc.Server
	grpcLis    net.Listener
	httpServer *http.Server
	httpLis    net.Listener

	consuming atomic.Bool
	stopping  atomic.Bool
}

// New connects to Postgres (applying migrations and creating the bootstrap
// namespaces) and the broker, and opens both listeners, so GRPCAddr and
// HTTPAddr are known before Run.
func New(ctx context.Context, cfg Config, log *slog.Logger, opts ...Option) (_ *Service, err error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Postgres.URL == "" {
		return nil, errors.New("dispatcher: FLO_DATABASE_URL is required")
	}
	if len(cfg.Kafka.Brokers) == 0 {
		return nil, errors.New("dispatcher: FLO_KAFKA_BROKERS is required")
	}
	if err := internalauth.Validate(cfg.Auth); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	// Replicas pass calls about other partitions to their owners.
	dial, err := internalauth.DialOptions(cfg.Auth, log)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	if cfg.ServiceAddr != "" {
		dial = append(dial, grpc.WithAuthority(cfg.ServiceAddr))
	}
	s := &Service{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			s.closeResources()
		}
	}()

	if s.pool, err = pg.Open(ctx, cfg.Postgres.URL, Schema, cfg.Postgres.MaxConns, migrations.FS, log); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	cat := catalog.New(s.pool, cfg.MaxActionsPerNamespace)
	if err = cat.Bootstrap(ctx, trimNames(cfg.BootstrapNamespaces)); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}

	meter := otel.Meter("github.com/razorbill/flo/services/dispatcher")
	if s.gauges, err = queue.NewGauges(s.pool, meter); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	s.listener = wake.NewListener(pg.Dialer(s.pool), map[string]func(string){
		store.ActionsChannel: cat.Invalidate,
	}, cat.Forget, log)
	if s.grpcLis, s.httpLis, err = stage.Listen(cfg.GRPCAddr, cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	s.httpServer = &http.Server{Handler: probe.Handler(s.ready(), o.metrics), ReadHeaderTimeout: 10 * time.Second}
	// Last, because the replica's clients are only released by its Run.
	if s.replica, err = owner.New(ctx, owner.Config{
		Kafka: cfg.Kafka, Partitions: cfg.Kafka.Partitions,
		MaxPayloadBytes: cmp.Or(cfg.MaxPayloadBytes, config.DefaultMaxPayloadBytes),
		Address:         advertised(cfg.AdvertiseAddr, s.grpcLis.Addr().String()), ReplicaID: uuid.NewString(),
		Memory: engine.Limits{PayloadBytes: cfg.PayloadMemory, Horizon: cfg.HotHorizon, QueuedTasks: cfg.QueuedTasks},
	}, s.pool, cat, log, meter); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	s.peers = owner.NewPeers(s.replica, dial, log)
	if s.grpcServer, err = grpcapi.NewGRPCServer(grpcapi.Deps{
		Catalog: cat, Replica: s.replica, Peers: s.peers, Queue: queue.New(s.pool, cat), Keys: apikey.New(s.pool, cat), Log: log,
	}, cfg.Auth); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	return s, nil
}

// GRPCAddr is the address the gRPC server listens on.
func (s *Service) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the address of /healthz, /readyz and /metrics.
func (s *Service) HTTPAddr() string { return s.httpLis.Addr().String() }

// Run serves until ctx ends or a component fails, then stops in order:
// readiness off (serving on for Shutdown.Delay), waiting claims released, gRPC
// drained, the partitions stopped (each ends its transaction in flight, the
// view is flushed and the replica leaves the group, so its partitions move at
// once), background work stopped, HTTP stopped and connections closed. A
// worker is answered only after its change is committed on the log, so
// stopping at any point loses nothing.
func (s *Service) Run(ctx context.Context) error {
	err := stage.Run(ctx, s.log,
		stage.HTTP(s.httpServer, s.httpLis, httpStopTimeout, s.log),
		stage.New("work").
			Go("listener", s.listener.Run).
			Go("queue gauges", s.gauges.Run),
		stage.New("partitions").Go("replica", func(ctx context.Context) error {
			s.consuming.Store(true)
			defer s.consuming.Store(false)
			return s.replica.Run(ctx)
		}).OnStop(func(context.Context) { s.peers.Close() }),
		stage.GRPC(s.grpcServer, s.grpcLis, grpcStopTimeout, s.log),
		stage.New("claims").OnStop(func(context.Context) { s.replica.Close() }),
		stage.Readiness(s.cfg.Shutdown.Delay, func() { s.stopping.Store(true) }, s.log),
	)
	s.closeResources()
	return err
}

// closeResources closes the listeners (if the servers did not) and the pool.
func (s *Service) closeResources() {
	for _, l := range []net.Listener{s.grpcLis, s.httpLis} {
		if l != nil {
			_ = l.Close()
		}
	}
	if s.pool != nil {
		s.pool.Close()
	}
}

// ready reports whether the dispatcher can do its work: not stopping, the
// database answering and the commands consumer running.
func (s *Service) ready() func(context.Context) error {
	return probe.All(probe.Unset(&s.stopping, "stopping"), probe.Set(&s.consuming, "commands consumer not running"), probe.Ping("database", s.pool, readyPingTimeout))
}

// advertised is the address peers reach a replica at: addr when set, else
// the listener's, with an unspecified host replaced by the host name.
func advertised(addr, listener string) string {
	if addr != "" {
		return addr
	}
	host, port, err := net.SplitHostPort(listener)
	if err != nil {
		return listener
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		if name, err := os.Hostname(); err == nil {
			host = name
		}
	}
	return net.JoinHostPort(host, port)
}

func trimNames(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}
