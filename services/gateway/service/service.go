// Package service wires the gateway: the public gRPC API and worker streams,
// the REST facade with health, readiness, OpenAPI and metrics, the producer
// of invoke commands, the task-events tail that wakes waiting requests, the
// worker-events tail that drains worker streams, and the connections to the
// dispatcher, the registry, the streams service and the workflow service.
// cmd/gateway and the dev stack run it.
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

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/grpcserver"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/retry"
	"github.com/razorbill/flo/libs/stage"
	"github.com/razorbill/flo/libs/telemetry"
	floproto "github.com/razorbill/flo/proto"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	workflowv1 "github.com/razorbill/flo/proto/gen/flo/workflow/v1"

	"github.com/razorbill/flo/services/gateway/internal/action"
	"github.com/razorbill/flo/services/gateway/internal/api"
	"github.com/razorbill/flo/services/gateway/internal/httpapi"
	"github.com/razorbill/flo/services/gateway/internal/invoke"
	"github.com/razorbill/flo/services/gateway/internal/namespace"
	"github.com/razorbill/flo/services/gateway/internal/recovery"
	"github.com/razorbill/flo/services/gateway/internal/taskwait"
	"github.com/razorbill/flo/services/gateway/internal/workerstream"
)

// Config is the gateway's configuration, read from FLO_* variables.
type Config struct {
	GRPCAddr       string `env:"FLO_GATEWAY_GRPC_ADDR, default=:9000"`
	HTTPAddr       string `env:"FLO_GATEWAY_HTTP_ADDR, default=:8080"`
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
	// AuthToken, when set, is the token every worker's Hello must carry.
	AuthToken string `env:"FLO_AUTH_TOKEN"`
	Kafka     config.Kafka
	Shutdown  config.Shutdown
}

const (
	// actionTTL is how long the answer "this action exists and is enabled"
	// is reused by invocations.
	actionTTL = time.Second
	// maxWaiters caps concurrent AwaitTask calls per process.
	maxWaiters = 100_000
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
)

// Option adjusts a Service.
type Option func(*options)

type options struct {
	metrics http.Handler
}

// WithMetricsHandler serves h at /metrics, typically the handler of the
// process's telemetry. Without it the Service sets telemetry up itself
// (libs/telemetry shares one setup per process) and releases it when Run
// returns.
func WithMetricsHandler(h http.Handler) Option {
	return func(o *options) { o.metrics = h }
}

// Service is a running gateway.
type Service struct {
	cfg Config
	log *slog.Logger

	grpcLis    net.Listener
	httpLis    net.Listener
	grpcServer *grpc.Server
	httpServer *http.Server

	conn         *grpc.ClientConn
	dispatcher   dispatcherv1.DispatcherClient
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

// New listens on both addresses (so GRPCAddr and HTTPAddr are known before
// Run), connects to the dispatcher and the broker and makes sure the topics
// exist. Nothing is served until Run.
func New(ctx context.Context, cfg Config, log *slog.Logger, opts ...Option) (_ *Service, err error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if cfg.MaxPayloadBytes <= 0 {
		return nil, fmt.Errorf("gateway config: FLO_MAX_PAYLOAD_BYTES must be positive, got %d", cfg.MaxPayloadBytes)
	}
	if cfg.DispatcherAddr == "" {
		return nil, errors.New("gateway config: FLO_DISPATCHER_ADDR is required")
	}
	if cfg.Kafka.Partitions <= 0 {
		cfg.Kafka.Partitions = 8
	}
	s := &Service{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			s.closeResources(context.Background())
		}
	}()

	if s.grpcLis, s.httpLis, err = stage.Listen(cfg.GRPCAddr, cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}

	if o.metrics == nil {
		if s.telemetry, err = telemetry.Setup(ctx, "gateway"); err != nil {
			return nil, fmt.Errorf("set up telemetry: %w", err)
		}
		o.metrics = s.telemetry.MetricsHandler()
	}

	// A claim can return up to 256 maximal payloads at once.
	claimRecv := 256*(cfg.MaxPayloadBytes+4<<10) + 1<<20
	s.conn, err = grpc.NewClient(cfg.DispatcherAddr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Minute, Timeout: 20 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(claimRecv)),
	)
	if err != nil {
		return nil, fmt.Errorf("dial dispatcher %s: %w", cfg.DispatcherAddr, err)
	}
	s.dispatcher = dispatcherv1.NewDispatcherClient(s.conn)

	registry := api.NoRegistry
	if cfg.RegistryAddr != "" {
		s.registryConn, err = grpc.NewClient(cfg.RegistryAddr, offPathDialOptions()...)
		if err != nil {
			return nil, fmt.Errorf("dial registry %s: %w", cfg.RegistryAddr, err)
		}
		registry = registryv1.NewRegistryClient(s.registryConn)
	}

	streams := api.NoStreams
	var workerStreams workerstream.Streams
	if cfg.StreamsAddr != "" {
		// Keepalive as for the dispatcher, since group reads block.
		s.streamsConn, err = grpc.NewClient(cfg.StreamsAddr, append(offPathDialOptions(),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Minute, Timeout: 20 * time.Second}),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(streamsRecvBytes)),
		)...)
		if err != nil {
			return nil, fmt.Errorf("dial streams service %s: %w", cfg.StreamsAddr, err)
		}
		client := streamsv1.NewStreamsClient(s.streamsConn)
		streams, workerStreams = client, client
	}

	var workflows workflowv1.WorkflowsClient
	if cfg.WorkflowAddr != "" {
		s.workflowConn, err = grpc.NewClient(cfg.WorkflowAddr, append(offPathDialOptions(),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(workflowRecvBytes)),
		)...)
		if err != nil {
			return nil, fmt.Errorf("dial workflow service %s: %w", cfg.WorkflowAddr, err)
		}
		workflows = workflowv1.NewWorkflowsClient(s.workflowConn)
	}

	tctx, cancel := context.WithTimeout(ctx, setupTimeout)
	s.producer, err = kafka.NewProducer(tctx, cfg.Kafka, cfg.Kafka.Partitions, cfg.MaxPayloadBytes,
		[]string{invoke.Topic, taskwait.Topic, workerstream.WorkerEventsTopic})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("gateway: producer: %w", err)
	}

	s.waiters = taskwait.NewRegistry(maxWaiters)

	namespaces := namespace.NewCache(api.NamespaceLookup(s.dispatcher))
	actions := action.NewCache(api.ActionLookup(s.dispatcher), actionTTL)
	nsServer := api.NewNamespaceServer(s.dispatcher, namespaces, log)
	actionServer := api.NewActionServer(s.dispatcher, namespaces, actions, log)
	taskServer := api.NewTaskServer(api.TaskServerDeps{
		Dispatcher:      s.dispatcher,
		Namespaces:      namespaces,
		Actions:         actions,
		Invoker:         invoke.NewProducer(s.producer),
		Waiters:         s.waiters,
		MaxPayloadBytes: cfg.MaxPayloadBytes,
		Log:             log,
	})
	s.streams = workerstream.NewServer(s.dispatcher, workerstream.Options{
		AuthToken:       cfg.AuthToken,
		MaxPayloadBytes: cfg.MaxPayloadBytes,
		DrainTimeout:    drainTimeout,
		CheckNamespace: func(ctx context.Context, name string) error {
			return api.CheckNamespace(ctx, log, namespaces, name)
		},
		Registry:       registry,
		Streams:        workerStreams,
		MaxReadRecords: api.MaxReadRecords(cfg.MaxPayloadBytes),
		Log:            log,
	})
	workerServer := api.NewWorkerServer(registry, namespaces, s.streams.DrainWorker, log)
	streamServer := api.NewStreamServer(streams, namespaces, cfg.MaxPayloadBytes, log)
	workflowServer := api.NewWorkflowServer(workflows, namespaces, cfg.MaxPayloadBytes, log)

	s.grpcServer = grpc.NewServer(
		grpc.StatsHandler(otelgrpc.NewServerHandler()),
		grpc.ChainUnaryInterceptor(recovery.UnaryInterceptor(log)),
		grpc.ChainStreamInterceptor(recovery.StreamInterceptor(log)),
		// Room for a ResultBatch, a maximal payload, or a maximal
		// InvokeTasks batch (api.DefaultMaxBatchBytes of payloads).
		grpc.MaxRecvMsgSize(max(minRecvMsgBytes, cfg.MaxPayloadBytes+bodySlack, api.DefaultMaxBatchBytes+batchSlack)),
		// Dead worker connections are noticed within a minute; workers may
		// ping every 10 s, idle or not.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	flov1.RegisterNamespaceServiceServer(s.grpcServer, nsServer)
	flov1.RegisterActionServiceServer(s.grpcServer, actionServer)
	flov1.RegisterTaskServiceServer(s.grpcServer, taskServer)
	flov1.RegisterWorkerServiceServer(s.grpcServer, s.streams)
	flov1.RegisterWorkerRegistryServiceServer(s.grpcServer, workerServer)
	flov1.RegisterStreamServiceServer(s.grpcServer, streamServer)
	flov1.RegisterWorkflowServiceServer(s.grpcServer, workflowServer)

	handler, err := httpapi.NewHandler(ctx, httpapi.Services{
		Namespaces: nsServer, Actions: actionServer, Tasks: taskServer, Workers: workerServer, Streams: streamServer,
		Workflows: workflowServer,
	}, httpapi.Options{
		MaxBodyBytes: maxBodyBytes(cfg.MaxPayloadBytes),
		Ready:        s.Ready,
		Metrics:      o.metrics,
		OpenAPI:      floproto.OpenAPI,
		Log:          log,
	})
	if err != nil {
		return nil, err
	}
	s.httpServer = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
	}

	// Last, because only Run releases the tails' clients.
	s.tail, err = kafka.NewTail(cfg.Kafka, []string{taskwait.Topic}, s.waiters.Handler(), log)
	if err != nil {
		return nil, fmt.Errorf("tail task events: %w", err)
	}
	s.workerTail, err = kafka.NewTail(cfg.Kafka, []string{workerstream.WorkerEventsTopic}, s.streams.WorkerEventsHandler(), log)
	if err != nil {
		return nil, fmt.Errorf("tail worker events: %w", err)
	}

	return s, nil
}

// offPathDialOptions dial a service off the task path (the registry, the
// streams and the workflow service): lazily, with trace context carried, and
// redialled at most registryRedialMax apart whenever the connection breaks,
// so a service that is down now costs nothing here.
func offPathDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: registryRedialMax},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
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

// Ready reports whether the gateway can serve: the dispatcher has answered
// and its connection is not failing, both tails know where they start, and
// shutdown has not begun. The registry, the streams and the workflow service
// are deliberately not asked: they are not on the task path, and worker
// streams run without them. (The worker-events tail needs only the broker,
// like the task-events tail.)
func (s *Service) Ready() bool {
	if s.stopping.Load() || !s.answered.Load() {
		return false
	}
	for _, t := range []*kafka.Tail{s.tail, s.workerTail} {
		select {
		case <-t.Ready():
		default:
			return false
		}
	}
	return s.conn.GetState() != connectivity.TransientFailure
}

// Run serves until ctx ends or a component fails, then shuts down: readiness
// off (serving on for Shutdown.Delay), worker streams drained and closed,
// servers stopped gracefully within a timeout, then the tails, the producer
// and the connections closed.
func (s *Service) Run(ctx context.Context) error {
	// The tail outlives the servers so that requests still waiting during
	// shutdown are woken; it stops once they have stopped.
	tailCtx, stopTail := context.WithCancel(context.WithoutCancel(ctx))
	defer stopTail()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.grpcServer.Serve(s.grpcLis); err != nil {
			return fmt.Errorf("serve gRPC: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := s.httpServer.Serve(s.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve HTTP: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		err := s.tail.Run(tailCtx)
		if tailCtx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("stopped unexpectedly")
		}
		return fmt.Errorf("task-events tail: %w", err)
	})
	g.Go(func() error {
		err := s.workerTail.Run(tailCtx)
		if tailCtx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("stopped unexpectedly")
		}
		return fmt.Errorf("worker-events tail: %w", err)
	})
	g.Go(func() error {
		s.probeDispatcher(gctx)
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		s.shutdown(ctx)
		stopTail()
		return nil
	})
	err := g.Wait()
	s.closeResources(context.WithoutCancel(ctx))
	return err
}

// shutdown stops serving in order; it returns once both servers stopped.
func (s *Service) shutdown(ctx context.Context) {
	s.stopping.Store(true)
	// Everything keeps serving a while with readiness off, so load
	// balancers stop sending requests and workers before they are refused.
	s.log.InfoContext(ctx, "gateway shutting down: readiness off", "serving_for", s.cfg.Shutdown.Delay)
	time.Sleep(s.cfg.Shutdown.Delay)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	s.streams.Shutdown()
	s.waiters.Close()

	grpcStopped := make(chan struct{})
	go func() {
		grpcserver.Stop(s.grpcServer, shutdownTimeout, s.log)
		close(grpcStopped)
	}()
	if err := s.httpServer.Shutdown(sctx); err != nil {
		s.log.WarnContext(ctx, "HTTP server did not stop gracefully", slog.Any("error", err))
		_ = s.httpServer.Close()
	}
	<-grpcStopped
	// Group reads of sessions that ended may still wait; they stop before
	// the streams connection closes, so their nacks get through.
	s.streams.Close()
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
	for _, l := range []net.Listener{s.grpcLis, s.httpLis} {
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
