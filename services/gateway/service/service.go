// Package service wires the gateway: the public gRPC API and worker streams
// and the REST facade with health, readiness and OpenAPI, every call checked
// by the auth guard, on TLS when configured; metrics on a port of their own;
// the producer of invoke commands, the task-outcomes tail that wakes waiting
// requests, the worker-events tail that drains worker streams, and the
// connections to the dispatcher, the registry, the streams service and the
// workflow service. cmd/gateway and the dev stack run it.
package service

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/certs"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/grpcserver"
	"github.com/razorbill/flo/libs/internalauth"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/probe"
	"github.com/razorbill/flo/libs/retry"
	"github.com/razorbill/flo/libs/stage"
	"github.com/razorbill/flo/libs/telemetry"
	floproto "github.com/razorbill/flo/proto"
	"github.com/razorbill/flo/proto/codec"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	workflowv1 "github.com/razorbill/flo/proto/gen/flo/workflow/v1"

	"github.com/razorbill/flo/services/gateway/internal/action"
	"github.com/razorbill/flo/services/gateway/internal/api"
	"github.com/razorbill/flo/services/gateway/internal/auth"
	"github.com/razorbill/flo/services/gateway/internal/httpapi"
	"github.com/razorbill/flo/services/gateway/internal/invoke"
	"github.com/razorbill/flo/services/gateway/internal/namespace"
	"github.com/razorbill/flo/services/gateway/internal/recovery"
	"github.com/razorbill/flo/services/gateway/internal/replicas"
	"github.com/razorbill/flo/services/gateway/internal/taskwait"
	"github.com/razorbill/flo/services/gateway/internal/workerstream"
)

// Config is the gateway's configuration, read from FLO_* variables.
type Config struct {
	GRPCAddr string `env:"FLO_GATEWAY_GRPC_ADDR, default=:9000"`
	HTTPAddr string `env:"FLO_GATEWAY_HTTP_ADDR, default=:8080"`
	// MetricsAddr serves /metrics, /healthz and /readyz, apart from the
	// public ports so that metrics need no key and reach only who may scrape
	// them. Empty (a config built in code) opens no metrics port.
	MetricsAddr    string `env:"FLO_GATEWAY_METRICS_ADDR, default=:9090"`
	DispatcherAddr string `env:"FLO_DISPATCHER_ADDR, default=localhost:9101"`
	// RegistryAddr is the registry's internal gRPC API. The task path does
	// not depend on it: while it is down, worker-registry calls fail with
	// Unavailable and worker streams carry on. Empty means there is no
	// registry, which looks the same to callers.
	RegistryAddr string `env:"FLO_REGISTRY_ADDR, default=localhost:9102"`
	// StreamsAddr is the streams service's internal gRPC API. Like the
	// registry it is off the task path: while it is down, stream calls and
	// stream workers' reads fail with Unavailable (reads are retried) and
	// everything else carries on. Empty means there is no streams service.
	StreamsAddr string `env:"FLO_STREAMS_ADDR, default=localhost:9103"`
	// WorkflowAddr is the workflow service's internal gRPC API, off the
	// task path like the streams service: while it is down, workflow calls
	// fail with Unavailable. Empty means there is no workflow service.
	WorkflowAddr    string `env:"FLO_WORKFLOW_ADDR, default=localhost:9104"`
	MaxPayloadBytes int    `env:"FLO_MAX_PAYLOAD_BYTES, default=1048576"`
	// TLSCertFile and TLSKeyFile, both or neither, put the public gRPC and
	// REST ports on TLS. The pair is read again when the files change, so a
	// renewed certificate needs no restart.
	TLSCertFile string `env:"FLO_GATEWAY_TLS_CERT"`
	TLSKeyFile  string `env:"FLO_GATEWAY_TLS_KEY"`
	// MaxConcurrentStreams caps the concurrent calls on one client
	// connection; zero means 1000.
	MaxConcurrentStreams uint32 `env:"FLO_GATEWAY_MAX_CONCURRENT_STREAMS, default=1000"`
	// MaxWorkerStreams caps the worker streams open on this gateway; a new
	// one past it gets ResourceExhausted. Zero means 20000.
	MaxWorkerStreams int `env:"FLO_GATEWAY_MAX_WORKER_STREAMS, default=20000"`
	// Auth is how the gateway authenticates to the internal services, and
	// whether authentication is on at all.
	Auth config.Auth
	// APIKeys checks the callers of the public API: the admin token, how
	// long a looked-up key is reused, and the per-role rate limits.
	APIKeys  auth.Config
	Kafka    config.Kafka
	Shutdown config.Shutdown
}

const (
	// actionTTL is how long the answer "this action exists and is enabled"
	// is reused by invocations.
	actionTTL = time.Second
	// maxWaiters caps concurrent AwaitTask calls per process.
	maxWaiters = 100_000
	// outcomesIdle is how long the task-outcomes tail goes on reading
	// after the last AwaitTask ended: a caller that awaits now and then
	// does not make it list offsets each time.
	outcomesIdle = 10 * time.Second
	// bodySlack is room above the payload limit for the fields around a
	// payload: in a REST body, in a gRPC message.
	bodySlack = 64 << 10
	// minRecvMsgBytes keeps gRPC's usual 4 MiB receive limit when the payload
	// limit is smaller, so a ResultBatch of several results still fits.
	minRecvMsgBytes = 4 << 20
	// batchSlack is room above an InvokeTasks batch's payload bytes for the
	// fields around up to api.MaxInvokeBatch items.
	batchSlack = 1 << 20
	// shutdownTimeout bounds the graceful part of Run's shutdown; drainTimeout,
	// within it, is how long worker streams wait for held tasks.
	shutdownTimeout = 20 * time.Second
	drainTimeout    = 10 * time.Second
	// setupTimeout bounds creating topics in New.
	setupTimeout = 30 * time.Second
	// registryRedialMax caps the wait between attempts to reach a registry,
	// streams or workflow service that is down, so workers' heartbeats and
	// reads and callers' workflow calls get through soon after it is back
	// (gRPC's own cap is two minutes).
	registryRedialMax = time.Second
	// streamsRecvBytes is the largest answer taken from the streams service:
	// a read's records are capped so their payloads stay within
	// api.ReadBudgetBytes, and each record may carry its payload a second
	// time as a JSON value, with room to spare for how a value encodes.
	streamsRecvBytes = 4*api.ReadBudgetBytes + 1<<20
	// workflowRecvBytes is the largest answer taken from the workflow
	// service, the most it sends: a run carries its input and every step's
	// output, each twice (raw and as a JSON value).
	workflowRecvBytes = 16 << 20
	// defaultMaxConcurrentStreams and defaultMaxWorkerStreams are the
	// limits of a config built in code that leaves them zero.
	defaultMaxConcurrentStreams = 1000
	defaultMaxWorkerStreams     = 20_000
)

// Option adjusts a Service.
type Option func(*options)

type options struct {
	metrics http.Handler
}

// WithMetricsHandler serves h at /metrics on the metrics port, typically the
// handler of the process's telemetry. Without it the Service sets telemetry
// up itself (libs/telemetry shares one setup per process) and releases it
// when Run returns.
func WithMetricsHandler(h http.Handler) Option {
	return func(o *options) { o.metrics = h }
}

// Service is a running gateway.
type Service struct {
	cfg Config
	log *slog.Logger

	grpcLis       net.Listener
	httpLis       net.Listener
	metricsLis    net.Listener
	grpcServer    *grpc.Server
	httpServer    *http.Server
	metricsServer *http.Server
	// edgeTLS is the public ports' TLS configuration; nil means plaintext.
	edgeTLS *tls.Config

	conn         *grpc.ClientConn
	dispatcher   dispatcherv1.DispatcherClient
	replicas     *replicas.Set
	registryConn *grpc.ClientConn
	streamsConn  *grpc.ClientConn
	workflowConn *grpc.ClientConn
	producer     *kgo.Client
	tail         *kafka.Tail
	// workerTail follows worker events to drain the streams of draining
	// workers.
	workerTail *kafka.Tail
	waiters    *taskwait.Registry
	streams    *workerstream.Server
	telemetry  *telemetry.Telemetry

	answered atomic.Bool
	stopping atomic.Bool
}

// internal are the gateway's clients of the services behind it. A service
// that is not configured is the API's stand-in, which answers Unavailable.
type internal struct {
	registry      registryv1.RegistryClient
	streams       streamsv1.StreamsClient
	workerStreams workerstream.Streams
	workflows     workflowv1.WorkflowsClient
}

// New listens on every address (so GRPCAddr, HTTPAddr and MetricsAddr are
// known before Run), connects to the dispatcher and the broker and makes sure
// the topics exist. Nothing is served until Run.
func New(ctx context.Context, cfg Config, log *slog.Logger, opts ...Option) (_ *Service, err error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg, err = withDefaults(cfg); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			s.closeResources(context.Background())
		}
	}()
	if err := s.listen(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if o.metrics == nil {
		if s.telemetry, err = telemetry.Setup(ctx, "gateway"); err != nil {
			return nil, fmt.Errorf("set up telemetry: %w", err)
		}
		o.metrics = s.telemetry.MetricsHandler()
	}
	behind, err := s.dialInternal()
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	tctx, cancel := context.WithTimeout(ctx, setupTimeout)
	s.producer, err = kafka.NewProducer(tctx, cfg.Kafka, cfg.Kafka.Partitions, cfg.MaxPayloadBytes,
		[]string{kafka.CommandsTopic, kafka.TaskOutcomesTopic, kafka.WorkerEventsTopic})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("gateway: producer: %w", err)
	}
	s.waiters = taskwait.NewRegistry(maxWaiters)
	guard, err := auth.New(cfg.APIKeys.Options(api.KeyLookup(s.dispatcher), cfg.Auth.Off(), log))
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	services := s.newAPI(behind)
	s.grpcServer = s.newGRPCServer(services, guard)
	if s.httpServer, err = s.newHTTPServer(ctx, services, guard); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	s.metricsServer = &http.Server{Handler: probe.Handler(s.readyz, o.metrics), ReadHeaderTimeout: 10 * time.Second}

	// Last, because only Run releases the tails' clients.
	s.tail, err = kafka.NewTail(cfg.Kafka, []string{kafka.TaskOutcomesTopic}, s.waiters.Handler(), log)
	if err != nil {
		return nil, fmt.Errorf("tail task outcomes: %w", err)
	}
	// Every replica would otherwise read every task event, waited for or
	// not: a per-task cost on each gateway that adding gateways multiplies.
	s.tail.ReadOnDemand(outcomesIdle)
	s.workerTail, err = kafka.NewTail(cfg.Kafka, []string{kafka.WorkerEventsTopic}, s.streams.WorkerEventsHandler(), log)
	if err != nil {
		return nil, fmt.Errorf("tail worker events: %w", err)
	}
	return s, nil
}

// ownerRouted is the dispatcher connection with the reports and touches of
// worker streams sent to the owners of their tasks' partitions.
type ownerRouted struct {
	dispatcherv1.DispatcherClient
	replicas *replicas.Set
}

func (o ownerRouted) Report(ctx context.Context, in *dispatcherv1.ReportRequest, opts ...grpc.CallOption) (*dispatcherv1.ReportResponse, error) {
	return o.replicas.Report(ctx, in, opts...)
}

func (o ownerRouted) Touch(ctx context.Context, in *dispatcherv1.TouchRequest, opts ...grpc.CallOption) (*flov1.TouchAck, error) {
	return o.replicas.Touch(ctx, in, opts...)
}

// withDefaults checks cfg and fills what a config built in code may leave
// zero.
func withDefaults(cfg Config) (Config, error) {
	switch {
	case cfg.MaxPayloadBytes <= 0:
		return cfg, fmt.Errorf("gateway config: FLO_MAX_PAYLOAD_BYTES must be positive, got %d", cfg.MaxPayloadBytes)
	case cfg.DispatcherAddr == "":
		return cfg, errors.New("gateway config: FLO_DISPATCHER_ADDR is required")
	case (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == ""):
		return cfg, errors.New("gateway config: FLO_GATEWAY_TLS_CERT and FLO_GATEWAY_TLS_KEY must be set together")
	case !cfg.Auth.Off() && cfg.APIKeys.AdminToken == "":
		return cfg, errors.New("gateway config: FLO_ADMIN_TOKEN is required: set the first admin key, or FLO_AUTH=off to run without authentication")
	case cfg.MaxWorkerStreams < 0:
		return cfg, fmt.Errorf("gateway config: FLO_GATEWAY_MAX_WORKER_STREAMS must not be negative, got %d", cfg.MaxWorkerStreams)
	}
	if cfg.Kafka.Partitions <= 0 {
		cfg.Kafka.Partitions = 8
	}
	cfg.MaxConcurrentStreams = cmp.Or(cfg.MaxConcurrentStreams, defaultMaxConcurrentStreams)
	cfg.MaxWorkerStreams = cmp.Or(cfg.MaxWorkerStreams, defaultMaxWorkerStreams)
	return cfg, nil
}

// listen opens the public ports, the REST one on TLS when the certificate
// files are set (the gRPC server speaks it itself), and the metrics port when
// it has an address.
func (s *Service) listen() (err error) {
	if s.grpcLis, s.httpLis, err = stage.Listen(s.cfg.GRPCAddr, s.cfg.HTTPAddr); err != nil {
		return err
	}
	if s.cfg.TLSCertFile != "" {
		// One reloading configuration for both ports, so both serve the
		// same certificate from the same reads of the files.
		if s.edgeTLS, err = certs.Server(s.cfg.TLSCertFile, s.cfg.TLSKeyFile, s.log); err != nil {
			return fmt.Errorf("edge TLS: %w", err)
		}
		s.httpLis = tls.NewListener(s.httpLis, s.edgeTLS)
	}
	if s.cfg.MetricsAddr != "" {
		if s.metricsLis, err = net.Listen("tcp", s.cfg.MetricsAddr); err != nil {
			return fmt.Errorf("listen metrics on %s: %w", s.cfg.MetricsAddr, err)
		}
	}
	return nil
}

// dialInternal connects to the dispatcher and to the configured services off
// the task path, every connection carrying the internal credential.
func (s *Service) dialInternal() (internal, error) {
	cfg := s.cfg
	behind := internal{registry: api.NoRegistry, streams: api.NoStreams}
	creds, err := internalauth.DialOptions(cfg.Auth, s.log)
	if err != nil {
		return behind, fmt.Errorf("internal credentials: %w", err)
	}
	// A claim can return up to 256 maximal payloads at once.
	claimRecv := 256*(cfg.MaxPayloadBytes+4<<10) + 1<<20
	dispatcherDial := append(slices.Clip(creds),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Minute, Timeout: 20 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(claimRecv)),
	)
	if s.conn, err = grpc.NewClient(cfg.DispatcherAddr, dispatcherDial...); err != nil {
		return behind, fmt.Errorf("dial dispatcher %s: %w", cfg.DispatcherAddr, err)
	}
	s.dispatcher = dispatcherv1.NewDispatcherClient(s.conn)
	s.replicas = replicas.New(s.dispatcher, replicas.Options{Dial: replicas.DialOptions(dispatcherDial, cfg.DispatcherAddr), Log: s.log,
		Partitions: cfg.Kafka.Partitions})

	offPath := append(slices.Clip(creds), offPathDialOptions()...)
	if cfg.RegistryAddr != "" {
		if s.registryConn, err = grpc.NewClient(cfg.RegistryAddr, offPath...); err != nil {
			return behind, fmt.Errorf("dial registry %s: %w", cfg.RegistryAddr, err)
		}
		behind.registry = registryv1.NewRegistryClient(s.registryConn)
	}
	if cfg.StreamsAddr != "" {
		// Keepalive as for the dispatcher, since group reads block.
		s.streamsConn, err = grpc.NewClient(cfg.StreamsAddr, append(slices.Clip(offPath),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Minute, Timeout: 20 * time.Second}),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(streamsRecvBytes)),
		)...)
		if err != nil {
			return behind, fmt.Errorf("dial streams service %s: %w", cfg.StreamsAddr, err)
		}
		client := streamsv1.NewStreamsClient(s.streamsConn)
		behind.streams, behind.workerStreams = client, client
	}
	if cfg.WorkflowAddr != "" {
		s.workflowConn, err = grpc.NewClient(cfg.WorkflowAddr, append(slices.Clip(offPath),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(workflowRecvBytes)),
		)...)
		if err != nil {
			return behind, fmt.Errorf("dial workflow service %s: %w", cfg.WorkflowAddr, err)
		}
		behind.workflows = workflowv1.NewWorkflowsClient(s.workflowConn)
	}
	return behind, nil
}

// offPathDialOptions dial a service off the task path (the registry, the
// streams and the workflow service): lazily, with trace context carried, and
// redialled at most registryRedialMax apart whenever the connection breaks,
// so a service that is down now costs nothing here.
func offPathDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: registryRedialMax},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
}

// newAPI builds the public API's servers over the internal services; the
// worker-stream server is kept, since Run drains it.
func (s *Service) newAPI(behind internal) httpapi.Services {
	cfg, log := s.cfg, s.log
	namespaces := namespace.NewCache(api.NamespaceLookup(s.dispatcher))
	actions := action.NewCache(api.ActionLookup(s.dispatcher), actionTTL)
	s.streams = workerstream.NewServer(ownerRouted{s.dispatcher, s.replicas}, workerstream.Options{
		MaxPayloadBytes: cfg.MaxPayloadBytes,
		DrainTimeout:    drainTimeout,
		CheckNamespace: func(ctx context.Context, name string) error {
			return api.CheckNamespace(ctx, log, namespaces, name)
		},
		Claimer:        s.replicas,
		Registry:       behind.registry,
		Streams:        behind.workerStreams,
		MaxReadRecords: api.MaxReadRecords(cfg.MaxPayloadBytes),
		Log:            log,
	})
	return httpapi.Services{
		Namespaces: api.NewNamespaceServer(s.dispatcher, namespaces, log),
		Actions:    api.NewActionServer(s.dispatcher, namespaces, actions, log),
		Tasks: api.NewTaskServer(api.TaskServerDeps{
			Dispatcher: s.dispatcher,
			Namespaces: namespaces,
			Actions:    actions,
			Invoker:    invoke.NewProducer(s.producer),
			Waiters:    s.waiters,
			// s.tail is made last in New, before anything is served.
			FollowEvents:    func(ctx context.Context) (func(), error) { return s.tail.Follow(ctx) },
			MaxPayloadBytes: cfg.MaxPayloadBytes,
			Log:             log,
		}),
		Workers:   api.NewWorkerServer(behind.registry, namespaces, s.streams.DrainWorker, log),
		Streams:   api.NewStreamServer(behind.streams, namespaces, cfg.MaxPayloadBytes, log),
		Workflows: api.NewWorkflowServer(behind.workflows, namespaces, cfg.MaxPayloadBytes, log),
		Keys:      api.NewKeyServer(s.dispatcher, log),
	}
}

// newGRPCServer builds the public gRPC server: traced with otelgrpc like
// every Flo server, errors mapped in one place, every call checked by the
// guard, worker streams capped, on TLS when the certificate files are set.
func (s *Service) newGRPCServer(svc httpapi.Services, guard *auth.Guard) *grpc.Server {
	cfg, log := s.cfg, s.log
	opts := []grpc.ServerOption{
		// A worker stream lasts as long as its worker: a span over it would
		// say nothing and hold memory on every idle connection. Its tasks
		// carry their own trace context; the call is still counted.
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithFilter(filters.Not(filters.FullMethodName(flov1.WorkerService_Stream_FullMethodName))))),
		grpc.ChainUnaryInterceptor(grpcserver.ErrorInterceptor(log, keepStatus), guard.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(recovery.StreamInterceptor(log), guard.StreamInterceptor(), capWorkerStreams(cfg.MaxWorkerStreams)),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		grpcserver.StreamWorkers(),
		// Calls from outside are decoded with their strings checked; what
		// the gateway sends is encoded without reflection.
		grpc.ForceServerCodecV2(codec.Public),
		// Room for a ResultBatch, a maximal payload, or a maximal
		// InvokeTasks batch (api.DefaultMaxBatchBytes of payloads).
		grpc.MaxRecvMsgSize(max(minRecvMsgBytes, cfg.MaxPayloadBytes+bodySlack, api.DefaultMaxBatchBytes+batchSlack)),
		// Dead worker connections are noticed within a minute; workers may
		// ping every 10 s, idle or not.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Fixed flow-control windows, which turns off gRPC's bandwidth
		// probing: it answered the first message after every quiet spell
		// (each idle worker's heartbeat) with a ping of its own.
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
	}
	if s.edgeTLS != nil {
		// No read buffer of gRPC's own over TLS: the TLS connection buffers
		// whole records already, and gRPC's 32 KB buffer would stay pinned
		// on every idle worker's connection (on plain TCP gRPC only takes
		// a pooled one while data is there, so the default stays).
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.edgeTLS)), grpc.ReadBufferSize(0))
	}
	srv := grpc.NewServer(opts...)
	flov1.RegisterNamespaceServiceServer(srv, svc.Namespaces)
	flov1.RegisterActionServiceServer(srv, svc.Actions)
	flov1.RegisterTaskServiceServer(srv, svc.Tasks)
	flov1.RegisterWorkerServiceServer(srv, s.streams)
	flov1.RegisterWorkerRegistryServiceServer(srv, svc.Workers)
	flov1.RegisterStreamServiceServer(srv, svc.Streams)
	flov1.RegisterWorkflowServiceServer(srv, svc.Workflows)
	flov1.RegisterKeyServiceServer(srv, svc.Keys)
	return srv
}

// streamWindow and connWindow are the gateway's flow-control windows: as
// large as the probing grows them on a fast network, so nothing waits on
// them there.
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// keepStatus keeps the status an API server answered with: the servers map
// the internal services' answers to public codes themselves.
func keepStatus(err error) error {
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	return nil
}

// capWorkerStreams refuses a worker stream with ResourceExhausted while max
// are open on this gateway, so a flood of workers cannot take every
// connection's memory; a worker's SDK retries with backoff.
func capWorkerStreams(max int) grpc.StreamServerInterceptor {
	var open atomic.Int64
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if info.FullMethod != flov1.WorkerService_Stream_FullMethodName {
			return handler(srv, ss)
		}
		defer open.Add(-1)
		if open.Add(1) > int64(max) {
			return status.Errorf(codes.ResourceExhausted, "this gateway has its maximum of %d worker streams open", max)
		}
		return handler(srv, ss)
	}
}

// newHTTPServer builds the REST facade: every request but the probes
// authenticated, every route authorized once matched.
func (s *Service) newHTTPServer(ctx context.Context, svc httpapi.Services, guard *auth.Guard) (*http.Server, error) {
	handler, err := httpapi.NewHandler(ctx, svc, httpapi.Options{
		MaxBodyBytes: maxBodyBytes(s.cfg.MaxPayloadBytes),
		Probes:       probe.Handler(s.readyz, nil),
		Authorize:    guard.REST(),
		OpenAPI:      floproto.OpenAPI,
		Log:          s.log,
	})
	if err != nil {
		return nil, err
	}
	return &http.Server{
		Handler:           guard.HTTP(handler),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
	}, nil
}

// maxBodyBytes is the largest REST body read: room for a payload at the
// limit sent base64-encoded in "payload" (4 bytes per 3), plus bodySlack.
func maxBodyBytes(maxPayload int) int64 {
	return int64((maxPayload+2)/3*4 + bodySlack)
}

// GRPCAddr is the address the gRPC server listens on.
func (s *Service) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the address the REST facade listens on.
func (s *Service) HTTPAddr() string { return s.httpLis.Addr().String() }

// MetricsAddr is the address of /metrics, /healthz and /readyz; empty when
// the config opened no metrics port.
func (s *Service) MetricsAddr() string {
	if s.metricsLis == nil {
		return ""
	}
	return s.metricsLis.Addr().String()
}

// Ready reports whether the gateway can serve, as /readyz does.
func (s *Service) Ready() bool { return s.readyz(context.Background()) == nil }

// readyz is the gateway's readiness: shutdown has not begun, the dispatcher
// has answered and its connection is not failing, and both tails know where
// they start. The registry, the streams and the workflow service are
// deliberately not asked: they are not on the task path, and worker streams
// run without them. (The worker-events tail needs only the broker, like the
// task-outcomes tail.)
func (s *Service) readyz(ctx context.Context) error {
	return probe.All(
		probe.Unset(&s.stopping, "stopping"),
		probe.Set(&s.answered, "dispatcher has not answered"),
		func(context.Context) error { return tailStarted("task-outcomes tail", s.tail) },
		func(context.Context) error { return tailStarted("worker-events tail", s.workerTail) },
		func(context.Context) error {
			if s.conn.GetState() == connectivity.TransientFailure {
				return errors.New("dispatcher connection failing")
			}
			return nil
		},
	)(ctx)
}

func tailStarted(name string, t *kafka.Tail) error {
	select {
	case <-t.Ready():
		return nil
	default:
		return fmt.Errorf("%s not started", name)
	}
}

// Run serves until ctx ends or a component fails, then stops in order:
// readiness off (serving on for Shutdown.Delay), worker streams told to drain
// and waiting requests woken, gRPC stopped gracefully (sessions hand back
// what they hold), REST stopped, the worker streams' reads closed, the tails
// stopped, the metrics port last; then the producer and the connections
// closed. The tails outlive the servers, so requests still waiting during
// shutdown are woken.
func (s *Service) Run(ctx context.Context) error {
	stages := []*stage.Stage{
		stage.New("tails").
			Go("task-outcomes tail", tailRun(s.tail)).
			Go("worker-events tail", tailRun(s.workerTail)),
		// Worker sessions claim through the replicas until the gRPC
		// server has stopped; then their connections close.
		stage.New("dispatcher replicas").Go("replica list", s.replicas.Run),
		// Group reads of sessions that ended may still wait; they stop
		// before the streams connection closes, so their nacks get through.
		stage.New("stream reads").OnStop(func(context.Context) { s.streams.Close() }),
		stage.HTTP(s.httpServer, s.httpLis, shutdownTimeout, s.log),
		stage.GRPC(s.grpcServer, s.grpcLis, shutdownTimeout, s.log),
		stage.New("worker streams").OnStop(func(context.Context) {
			s.streams.Shutdown()
			s.waiters.Close()
		}),
		stage.Readiness(s.cfg.Shutdown.Delay, func() { s.stopping.Store(true) }, s.log).
			Go("dispatcher probe", func(ctx context.Context) error {
				s.probeDispatcher(ctx)
				return nil
			}),
	}
	if s.metricsLis != nil {
		stages = append([]*stage.Stage{stage.HTTP(s.metricsServer, s.metricsLis, shutdownTimeout, s.log)}, stages...)
	}
	err := stage.Run(ctx, s.log, stages...)
	s.closeResources(context.WithoutCancel(ctx))
	return err
}

// tailRun runs t until its stage stops; a tail that stops before that is a
// failure.
func tailRun(t *kafka.Tail) func(context.Context) error {
	return func(ctx context.Context) error {
		err := t.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("stopped unexpectedly")
		}
		return err
	}
}

// closeResources releases what New opened; it tolerates a partial New.
func (s *Service) closeResources(ctx context.Context) {
	if s.producer != nil {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := s.producer.Flush(fctx); err != nil {
			s.log.WarnContext(ctx, "flush producer", slog.Any("error", err))
		}
		cancel()
		s.producer.Close()
	}
	for _, c := range []*grpc.ClientConn{s.conn, s.registryConn, s.streamsConn, s.workflowConn} {
		if c != nil {
			_ = c.Close()
		}
	}
	for _, l := range []net.Listener{s.grpcLis, s.httpLis, s.metricsLis} {
		if l != nil {
			_ = l.Close()
		}
	}
	if s.telemetry != nil {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := s.telemetry.Shutdown(tctx); err != nil {
			s.log.WarnContext(ctx, "shut down telemetry", slog.Any("error", err))
		}
		cancel()
	}
}

// probeDispatcher calls the dispatcher until it answers once; from then on
// readiness follows the connection's state.
func (s *Service) probeDispatcher(ctx context.Context) {
	probe := func() error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := s.dispatcher.ListNamespaces(pctx, &flov1.ListNamespacesRequest{})
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			return err
		}
		return nil
	}
	if retry.Do(ctx, retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}, probe, nil) != nil {
		return
	}
	s.answered.Store(true)
	s.log.InfoContext(ctx, "dispatcher answered", slog.String("addr", s.cfg.DispatcherAddr))
}
