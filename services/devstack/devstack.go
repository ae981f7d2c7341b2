// Package devstack runs the whole Flo platform in one process: an embedded
// Kafka-protocol broker and a private Postgres when none are configured, then
// every service. `flo dev`, the end-to-end tests and `make bench` use it, so all
// three exercise the same services a deployment runs, wired the same way.
package devstack

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/localbroker"
	"github.com/razorbill/flo/libs/localpg"
	"github.com/razorbill/flo/libs/telemetry"
	dispatcher "github.com/razorbill/flo/services/dispatcher/service"
	gateway "github.com/razorbill/flo/services/gateway/service"
	registry "github.com/razorbill/flo/services/registry/service"
	streams "github.com/razorbill/flo/services/streams/service"
	workflow "github.com/razorbill/flo/services/workflow/service"
)

// Config says where the stack keeps its data and listens. Zero values work on a
// laptop: data under .flo/, the ports of the design.
type Config struct {
	// DataDir holds the embedded broker's and Postgres's data.
	DataDir string `env:"FLO_DATA_DIR, default=.flo"`
	// DatabaseURL is an existing Postgres; empty starts a private one.
	DatabaseURL string `env:"FLO_DATABASE_URL"`
	// PostgresPort is where the private Postgres listens.
	PostgresPort int `env:"FLO_DEV_POSTGRES_PORT, default=5433"`
	// Kafka is an existing Kafka-protocol cluster (with its TLS and SASL
	// settings) and the partition count of the topics the services create;
	// no brokers starts the embedded broker.
	Kafka config.Kafka
	// BrokerPort is where the embedded broker listens.
	BrokerPort int `env:"FLO_DEV_BROKER_PORT, default=9092"`

	// AdminToken is the admin key of the gateway; empty reads it from (or
	// makes it in) DataDir/admin-token.
	AdminToken string `env:"FLO_ADMIN_TOKEN"`

	// The public ports listen on loopback: a laptop's stack is not for the
	// network unless these say so.
	GatewayGRPCAddr    string `env:"FLO_GATEWAY_GRPC_ADDR, default=127.0.0.1:9000"`
	GatewayHTTPAddr    string `env:"FLO_GATEWAY_HTTP_ADDR, default=127.0.0.1:8080"`
	GatewayMetricsAddr string `env:"FLO_GATEWAY_METRICS_ADDR, default=127.0.0.1:9090"`
	// GatewayTLSCert and GatewayTLSKey, both or neither, put the gateway's
	// public ports on TLS, as in production.
	GatewayTLSCert     string `env:"FLO_GATEWAY_TLS_CERT"`
	GatewayTLSKey      string `env:"FLO_GATEWAY_TLS_KEY"`
	DispatcherGRPCAddr string `env:"FLO_DISPATCHER_GRPC_ADDR, default=127.0.0.1:9101"`
	DispatcherHTTPAddr string `env:"FLO_DISPATCHER_HTTP_ADDR, default=127.0.0.1:9111"`
	RegistryGRPCAddr   string `env:"FLO_REGISTRY_GRPC_ADDR, default=127.0.0.1:9102"`
	RegistryHTTPAddr   string `env:"FLO_REGISTRY_HTTP_ADDR, default=127.0.0.1:9112"`
	StreamsGRPCAddr    string `env:"FLO_STREAMS_GRPC_ADDR, default=127.0.0.1:9103"`
	StreamsHTTPAddr    string `env:"FLO_STREAMS_HTTP_ADDR, default=127.0.0.1:9113"`
	WorkflowGRPCAddr   string `env:"FLO_WORKFLOW_GRPC_ADDR, default=127.0.0.1:9104"`
	WorkflowHTTPAddr   string `env:"FLO_WORKFLOW_HTTP_ADDR, default=127.0.0.1:9114"`

	// Namespaces are created at start.
	Namespaces []string `env:"FLO_BOOTSTRAP_NAMESPACES, default=default,myapp"`

	// The services' other settings (limits such as
	// FLO_MAX_WORKERS_PER_NAMESPACE, caches, ticks, stream caps) are each
	// service's own: Start reads them from the environment with the
	// service's names and defaults, as its binary does. The fields below
	// are the ones tests set in code; zero takes the environment's value.

	// HeartbeatTimeout is how long a silent worker stays healthy.
	HeartbeatTimeout time.Duration `env:"FLO_WORKER_HEARTBEAT_TIMEOUT, default=90s"`
	// HealthCheckInterval is how often silent workers are looked for.
	HealthCheckInterval time.Duration `env:"FLO_WORKER_HEALTH_CHECK_INTERVAL, default=5s"`
	// MaxPayloadBytes bounds an invocation's payload, a task's result and a
	// run's input; every service's producer is sized for it.
	MaxPayloadBytes int `env:"FLO_MAX_PAYLOAD_BYTES, default=1048576"`
	// PostgresFsync keeps the private Postgres crash-safe; tests turn it off.
	PostgresFsync bool `env:"FLO_DEV_POSTGRES_FSYNC, default=true"`
}

// privateDatabase is the database the stack creates in its private Postgres.
const privateDatabase = "flo"

// PostgresURL is the database the stack's services use: DatabaseURL, or the
// private Postgres at PostgresPort, as `flo dev` runs it.
func (c Config) PostgresURL() string {
	if c.DatabaseURL != "" {
		return c.DatabaseURL
	}
	return localpg.URLAt(c.PostgresPort, privateDatabase)
}

// OnEphemeralPorts makes every service listen on loopback at a port the
// system picks, so several stacks (tests, benchmarks) run side by side;
// Stack reports the addresses.
func (c *Config) OnEphemeralPorts() {
	for _, addr := range []*string{&c.GatewayGRPCAddr, &c.GatewayHTTPAddr, &c.GatewayMetricsAddr, &c.DispatcherGRPCAddr,
		&c.DispatcherHTTPAddr, &c.RegistryGRPCAddr, &c.RegistryHTTPAddr, &c.StreamsGRPCAddr,
		&c.StreamsHTTPAddr, &c.WorkflowGRPCAddr, &c.WorkflowHTTPAddr} {
		*addr = "127.0.0.1:0"
	}
}

// Option adjusts Start.
type Option func(*options)

type options struct {
	telemetry []telemetry.Option
}

// WithSpanProcessor hands every span the stack's services record to sp, until
// Stop (which shuts sp down). Tests pass a tracetest.SpanRecorder.
func WithSpanProcessor(sp sdktrace.SpanProcessor) Option {
	return func(o *options) { o.telemetry = append(o.telemetry, telemetry.WithSpanProcessor(sp)) }
}

// Stack is a running platform.
type Stack struct {
	cfg Config
	log *slog.Logger

	pg        *localpg.Server
	broker    *localbroker.Broker
	telemetry *telemetry.Telemetry
	dbURL     string
	kafka     config.Kafka
	admin     string
	// internal is the credential the services' internal calls carry: a
	// token made at start, so it never leaves the process.
	internal config.Auth

	mu       sync.Mutex
	services map[string]*running
	gateway  *gateway.Service

	failed   chan struct{}
	failOnce sync.Once
}

// running is one service's Run, stoppable on its own.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

// Start brings up the infrastructure and every service and returns once the
// gateway is ready. Stop ends them all.
func Start(ctx context.Context, cfg Config, log *slog.Logger, opts ...Option) (*Stack, error) {
	s := &Stack{
		cfg: cfg, log: log, services: map[string]*running{}, failed: make(chan struct{}),
		dbURL: cfg.DatabaseURL, kafka: cfg.Kafka,
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	tel, err := telemetry.Setup(ctx, "flo", o.telemetry...)
	if err != nil {
		return nil, fmt.Errorf("set up telemetry: %w", err)
	}
	s.telemetry = tel
	if s.admin, err = resolveAdminToken(cfg); err != nil {
		s.Stop()
		return nil, err
	}
	s.internal = config.Auth{Mode: "on", InternalToken: rand.Text()}
	if err := s.startInfra(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.StartDispatcher(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.StartRegistry(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.StartStreams(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.StartWorkflow(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.startGateway(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Stack) startInfra(ctx context.Context) error {
	if s.dbURL == "" {
		dir, err := filepath.Abs(filepath.Join(s.cfg.DataDir, "postgres"))
		if err != nil {
			return fmt.Errorf("postgres data dir: %w", err)
		}
		s.log.Info("starting private postgres", "data_dir", dir, "port", s.cfg.PostgresPort)
		pg, err := localpg.Start(ctx, dir, s.cfg.PostgresPort, localpg.Options{Fsync: s.cfg.PostgresFsync})
		if err != nil {
			return fmt.Errorf("start postgres: %w", err)
		}
		s.pg = pg
		if err := pg.CreateDatabase(ctx, privateDatabase); err != nil {
			return fmt.Errorf("create database: %w", err)
		}
		s.dbURL = pg.URL(privateDatabase)
	}
	if len(s.kafka.Brokers) == 0 {
		dir, err := filepath.Abs(filepath.Join(s.cfg.DataDir, "kafka"))
		if err != nil {
			return fmt.Errorf("broker data dir: %w", err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("broker data dir: %w", err)
		}
		s.log.Info("starting embedded broker", "data_dir", dir, "port", s.cfg.BrokerPort)
		b, err := localbroker.Start(s.cfg.BrokerPort, dir, s.cfg.Kafka.Partitions)
		if err != nil {
			return fmt.Errorf("start broker: %w", err)
		}
		s.broker = b
		s.kafka.Brokers = b.Addrs()
	}
	return nil
}

// StartDispatcher starts a dispatcher replica (again, after StopDispatcher).
func (s *Stack) StartDispatcher(ctx context.Context) error {
	svc, err := s.newDispatcher(ctx, s.cfg.DispatcherGRPCAddr, s.cfg.DispatcherHTTPAddr)
	if err != nil {
		return err
	}
	// The gateway dials the dispatcher's address, so a replacement must bind
	// the same one: remember what the first bind picked.
	s.cfg.DispatcherGRPCAddr = svc.GRPCAddr()
	s.cfg.DispatcherHTTPAddr = svc.HTTPAddr()
	s.run("dispatcher", svc.Run)
	return nil
}

// StartDispatcherReplica starts one more dispatcher replica beside the first,
// on ports the system picks, as the service called name ("dispatcher" is the
// first); Stop ends it. flo-bench runs two replicas in one process this way.
func (s *Stack) StartDispatcherReplica(ctx context.Context, name string) error {
	svc, err := s.newDispatcher(ctx, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s.run(name, svc.Run)
	return nil
}

func (s *Stack) newDispatcher(ctx context.Context, grpcAddr, httpAddr string) (*dispatcher.Service, error) {
	cfg, err := serviceConfig[dispatcher.Config](ctx, "dispatcher")
	if err != nil {
		return nil, err
	}
	cfg.GRPCAddr, cfg.HTTPAddr = grpcAddr, httpAddr
	// The replicas of one stack reach each other at their listeners.
	cfg.AdvertiseAddr, cfg.ServiceAddr = "", ""
	cfg.BootstrapNamespaces = s.cfg.Namespaces
	cfg.MaxPayloadBytes = cmp.Or(s.cfg.MaxPayloadBytes, cfg.MaxPayloadBytes)
	cfg.Postgres = config.Postgres{URL: s.dbURL, MaxConns: 16}
	cfg.Kafka, cfg.Auth = s.kafka, s.internal
	svc, err := dispatcher.New(ctx, cfg, s.log.With("component", "dispatcher"), dispatcher.WithMetricsHandler(s.telemetry.MetricsHandler()))
	if err != nil {
		return nil, fmt.Errorf("start dispatcher: %w", err)
	}
	return svc, nil
}

// StopDispatcher stops the dispatcher and waits for it to end.
func (s *Stack) StopDispatcher() error { return s.stop("dispatcher") }

// StartRegistry starts a registry replica (again, after StopRegistry).
func (s *Stack) StartRegistry(ctx context.Context) error {
	cfg, err := serviceConfig[registry.Config](ctx, "registry")
	if err != nil {
		return err
	}
	cfg.GRPCAddr, cfg.HTTPAddr = s.cfg.RegistryGRPCAddr, s.cfg.RegistryHTTPAddr
	cfg.HeartbeatTimeout = cmp.Or(s.cfg.HeartbeatTimeout, cfg.HeartbeatTimeout)
	cfg.HealthCheckInterval = cmp.Or(s.cfg.HealthCheckInterval, cfg.HealthCheckInterval)
	cfg.MaxPayloadBytes = cmp.Or(s.cfg.MaxPayloadBytes, cfg.MaxPayloadBytes)
	cfg.Postgres = config.Postgres{URL: s.dbURL, MaxConns: 8}
	cfg.Kafka, cfg.Auth = s.kafka, s.internal
	svc, err := registry.New(ctx, cfg, s.log.With("component", "registry"), registry.WithMetricsHandler(s.telemetry.MetricsHandler()))
	if err != nil {
		return fmt.Errorf("start registry: %w", err)
	}
	s.cfg.RegistryGRPCAddr = svc.GRPCAddr()
	s.cfg.RegistryHTTPAddr = svc.HTTPAddr()
	s.run("registry", svc.Run)
	return nil
}

// StopRegistry stops the registry and waits for it to end.
func (s *Stack) StopRegistry() error { return s.stop("registry") }

// StartStreams starts a streams replica (again, after StopStreams).
func (s *Stack) StartStreams(ctx context.Context) error {
	cfg, err := serviceConfig[streams.Config](ctx, "streams")
	if err != nil {
		return err
	}
	cfg.GRPCAddr, cfg.HTTPAddr = s.cfg.StreamsGRPCAddr, s.cfg.StreamsHTTPAddr
	cfg.Postgres = config.Postgres{URL: s.dbURL, MaxConns: 16}
	cfg.Kafka, cfg.Auth = s.kafka, s.internal
	svc, err := streams.New(ctx, cfg, s.log.With("component", "streams"), streams.WithMetricsHandler(s.telemetry.MetricsHandler()))
	if err != nil {
		return fmt.Errorf("start streams: %w", err)
	}
	s.cfg.StreamsGRPCAddr = svc.GRPCAddr()
	s.cfg.StreamsHTTPAddr = svc.HTTPAddr()
	s.run("streams", svc.Run)
	return nil
}

// StopStreams stops the streams service and waits for it to end.
func (s *Stack) StopStreams() error { return s.stop("streams") }

// StartWorkflow starts a workflow service replica (again, after StopWorkflow).
func (s *Stack) StartWorkflow(ctx context.Context) error {
	cfg, err := serviceConfig[workflow.Config](ctx, "workflow")
	if err != nil {
		return err
	}
	cfg.GRPCAddr, cfg.HTTPAddr = s.cfg.WorkflowGRPCAddr, s.cfg.WorkflowHTTPAddr
	cfg.MaxPayloadBytes = cmp.Or(s.cfg.MaxPayloadBytes, cfg.MaxPayloadBytes)
	cfg.StreamsAddr = s.cfg.StreamsGRPCAddr
	cfg.Postgres = config.Postgres{URL: s.dbURL, MaxConns: 16}
	cfg.Kafka, cfg.Auth = s.kafka, s.internal
	svc, err := workflow.New(ctx, cfg, s.log.With("component", "workflow"), workflow.WithMetricsHandler(s.telemetry.MetricsHandler()))
	if err != nil {
		return fmt.Errorf("start workflow: %w", err)
	}
	s.cfg.WorkflowGRPCAddr = svc.GRPCAddr()
	s.cfg.WorkflowHTTPAddr = svc.HTTPAddr()
	s.run("workflow", svc.Run)
	return nil
}

// StopWorkflow stops the workflow service and waits for it to end.
func (s *Stack) StopWorkflow() error { return s.stop("workflow") }

func (s *Stack) startGateway(ctx context.Context) error {
	// The key cache, the per-role rate limits and the stream caps are the
	// gateway's own settings (FLO_AUTH_KEY_CACHE_TTL, FLO_RATE_LIMIT_*,
	// FLO_GATEWAY_MAX_*), as in production.
	cfg, err := serviceConfig[gateway.Config](ctx, "gateway")
	if err != nil {
		return err
	}
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.MetricsAddr = s.cfg.GatewayGRPCAddr, s.cfg.GatewayHTTPAddr, s.cfg.GatewayMetricsAddr
	cfg.DispatcherAddr, cfg.RegistryAddr = s.cfg.DispatcherGRPCAddr, s.cfg.RegistryGRPCAddr
	cfg.StreamsAddr, cfg.WorkflowAddr = s.cfg.StreamsGRPCAddr, s.cfg.WorkflowGRPCAddr
	cfg.MaxPayloadBytes = cmp.Or(s.cfg.MaxPayloadBytes, cfg.MaxPayloadBytes)
	cfg.TLSCertFile, cfg.TLSKeyFile = s.cfg.GatewayTLSCert, s.cfg.GatewayTLSKey
	cfg.Kafka, cfg.Auth = s.kafka, s.internal
	cfg.APIKeys.AdminToken = s.admin
	svc, err := gateway.New(ctx, cfg, s.log.With("component", "gateway"), gateway.WithMetricsHandler(s.telemetry.MetricsHandler()))
	if err != nil {
		return fmt.Errorf("start gateway: %w", err)
	}
	s.gateway = svc
	// A restarted gateway binds the addresses the first one picked, where
	// its clients and workers reconnect.
	s.cfg.GatewayGRPCAddr, s.cfg.GatewayHTTPAddr = svc.GRPCAddr(), svc.HTTPAddr()
	s.cfg.GatewayMetricsAddr = cmp.Or(svc.MetricsAddr(), s.cfg.GatewayMetricsAddr)
	s.run("gateway", svc.Run)
	return nil
}

// RestartGateway stops the gateway, as a deploy would, and starts a new one
// on the same addresses, returning once it is ready: every client and worker
// connected to the old one reconnects at once.
func (s *Stack) RestartGateway(ctx context.Context) error {
	if err := s.stop("gateway"); err != nil {
		return err
	}
	if err := s.startGateway(ctx); err != nil {
		return err
	}
	return s.waitReady(ctx)
}

// serviceConfig reads a service's settings from the environment with the
// service's own names and defaults; the caller then sets what the stack
// decides: addresses, database, broker and credentials.
func serviceConfig[C any](ctx context.Context, service string) (C, error) {
	var cfg C
	if err := config.Load(ctx, &cfg); err != nil {
		return cfg, fmt.Errorf("%s config: %w", service, err)
	}
	return cfg, nil
}

func (s *Stack) run(name string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	s.mu.Lock()
	s.services[name] = r
	s.mu.Unlock()
	go func() {
		err := fn(ctx)
		if ctx.Err() == nil {
			s.log.Error("service stopped on its own", "service", name, "error", err)
			s.failOnce.Do(func() { close(s.failed) })
		}
		r.done <- err
	}()
}

func (s *Stack) stop(name string) error {
	s.mu.Lock()
	r := s.services[name]
	delete(s.services, name)
	s.mu.Unlock()
	if r == nil {
		return nil
	}
	r.cancel()
	if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	return nil
}

// waitReady waits until the gateway is ready: start-up is a one-off, not a hot path.
func (s *Stack) waitReady(ctx context.Context) error {
	// Asked in process rather than over /readyz, which is https when the
	// gateway has TLS; the listeners are open since New, so a client that
	// connects once this holds is served.
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !s.gateway.Ready() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for gateway readiness: %w", ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// Done is closed when a service stops without being asked to.
func (s *Stack) Done() <-chan struct{} { return s.failed }

// GatewayGRPCAddr is where clients and workers connect.
func (s *Stack) GatewayGRPCAddr() string { return s.gateway.GRPCAddr() }

// GatewayHTTPAddr is where the REST facade listens.
func (s *Stack) GatewayHTTPAddr() string { return s.gateway.HTTPAddr() }

// GatewayMetricsAddr is where the gateway serves /metrics.
func (s *Stack) GatewayMetricsAddr() string { return s.gateway.MetricsAddr() }

// AdminToken is the gateway's admin key: clients send it as their token.
func (s *Stack) AdminToken() string { return s.admin }

// DatabaseURL is the Postgres the services use.
func (s *Stack) DatabaseURL() string { return s.dbURL }

// KafkaBrokers are the brokers the services use.
func (s *Stack) KafkaBrokers() []string { return s.kafka.Brokers }

// Broker is the embedded broker, nil when an external one is configured.
func (s *Stack) Broker() *localbroker.Broker { return s.broker }

// Stop stops the services (gateway first, so no new work enters), then the
// broker and Postgres it started.
func (s *Stack) Stop() {
	names := []string{"gateway", "workflow", "streams", "registry", "dispatcher"}
	// Then the replicas StartDispatcherReplica added.
	s.mu.Lock()
	for name := range s.services {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	s.mu.Unlock()
	for _, name := range names {
		if err := s.stop(name); err != nil {
			s.log.Error("stop service", "service", name, "error", err)
		}
	}
	if s.broker != nil {
		s.broker.Close()
	}
	if s.pg != nil {
		if err := s.pg.Stop(); err != nil {
			s.log.Error("stop postgres", "error", err)
		}
	}
	if err := s.telemetry.Shutdown(context.Background()); err != nil {
		s.log.Error("telemetry shutdown", "error", err)
	}
}
