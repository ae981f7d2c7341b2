// Package service wires the workflow service: Postgres pool and migrations,
// the definition catalog, the runner with its task-event consumer and timer
// loop, the outbox relay, and the gRPC and HTTP servers, with an orderly
// graceful stop.
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
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/internalauth"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/probe"
	"github.com/razorbill/flo/libs/stage"
	"github.com/razorbill/flo/libs/sweep"
	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/libs/wake"
	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	"github.com/razorbill/flo/services/workflow/internal/catalog"
	"github.com/razorbill/flo/services/workflow/internal/grpcapi"
	"github.com/razorbill/flo/services/workflow/internal/runner"
	"github.com/razorbill/flo/services/workflow/internal/schedule"
	"github.com/razorbill/flo/services/workflow/internal/store"
	"github.com/razorbill/flo/services/workflow/internal/timer"
	"github.com/razorbill/flo/services/workflow/internal/trigger"
	"github.com/razorbill/flo/services/workflow/migrations"
)

// Schema is the workflow service's Postgres schema.
const Schema = "workflow"

// Shutdown bounds.
const (
	grpcStopTimeout  = 10 * time.Second
	relayFlushWait   = 5 * time.Second
	httpStopTimeout  = 5 * time.Second
	readyPingTimeout = time.Second
)

// planSweepInterval is how often expired plan cache entries and old rate
// windows are deleted; an expired entry is never served in between (reads
// check expires_at).
const planSweepInterval = time.Minute

// defaultScheduleTick is the scheduler's safety tick when Config leaves it
// zero.
const defaultScheduleTick = 5 * time.Second

// Config is the workflow service's configuration, read from FLO_* variables.
type Config struct {
	GRPCAddr string `env:"FLO_WORKFLOW_GRPC_ADDR, default=:9104"`
	HTTPAddr string `env:"FLO_WORKFLOW_HTTP_ADDR, default=:9114"`
	// MaxPayloadBytes bounds a run's input and a signal's payload; the
	// gateway applies the same variable to what it accepts.
	MaxPayloadBytes int `env:"FLO_MAX_PAYLOAD_BYTES, default=1048576"`
	// TimerTick is the slowest the timer loop looks for due timers; it
	// normally wakes exactly when the next one is due.
	TimerTick time.Duration `env:"FLO_WORKFLOW_TIMER_TICK, default=1s"`
	// ScheduleTick is the slowest the scheduler looks for due schedules;
	// it normally wakes exactly at the next fire time. Zero means 5s.
	ScheduleTick time.Duration `env:"FLO_WORKFLOW_SCHEDULE_TICK, default=5s"`
	// StreamsAddr is the streams service's internal gRPC API, which stream
	// triggers read through. While it is down triggers wait (and retry);
	// everything else carries on. Empty means there is no streams service:
	// triggers do not run.
	StreamsAddr string `env:"FLO_STREAMS_ADDR, default=localhost:9103"`
	// TriggerTimeout is how long records a trigger read stay with this
	// replica before its group hands them out again: what a crash between
	// reading records and acking them delays them by. Zero means 30s.
	TriggerTimeout time.Duration `env:"FLO_WORKFLOW_TRIGGER_TIMEOUT, default=30s"`
	// MaxWorkflowVersionsPerNamespace refuses creating a workflow version
	// past this many (of all workflows) in a namespace. Zero means the default.
	MaxWorkflowVersionsPerNamespace int `env:"FLO_MAX_WORKFLOW_VERSIONS_PER_NAMESPACE, default=10000"`
	// MaxPendingSignalsPerNamespace refuses a signal no step waits for past
	// this many signals no step has taken in a namespace. Zero means the
	// default.
	MaxPendingSignalsPerNamespace int `env:"FLO_MAX_PENDING_SIGNALS_PER_NAMESPACE, default=100000"`
	Postgres                      config.Postgres
	Kafka                         config.Kafka
	Shutdown                      config.Shutdown
	// Auth is the internal credential its gRPC server requires and its
	// clients of other services carry.
	Auth config.Auth
}

// Option adjusts a Service.
type Option func(*options)

type options struct {
	metrics http.Handler
	now     func() time.Time
}

// WithClock makes schedules read the time from now instead of time.Now, so
// a test can move it.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// WithMetricsHandler serves h at /metrics, typically the handler of the
// process's telemetry.Setup. Without it /metrics is not served.
func WithMetricsHandler(h http.Handler) Option {
	return func(o *options) { o.metrics = h }
}

// Service is a running workflow service.
type Service struct {
	cfg Config
	log *slog.Logger

	pool     *pgxpool.Pool
	producer *kgo.Client
	consumer *kafka.Consumer
	relay    *outbox.Relay
	runner   *runner.Runner
	gauges   *telemetry.Gauges
	timers   *timer.Loop
	listener *wake.Listener
	// schedules is the scheduler loop.
	schedules *timer.Loop
	// triggers runs stream triggers; nil without a streams service.
	triggers    *trigger.Manager
	streamsConn *grpc.ClientConn

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
	o := options{now: time.Now}
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
		return nil, fmt.Errorf("workflow: %w", err)
	}
	if s.producer, err = kafka.NewProducer(ctx, cfg.Kafka, cfg.Kafka.Partitions, cfg.MaxPayloadBytes,
		[]string{kafka.CommandsTopic, kafka.TaskOutcomesTopic, kafka.RunEventsTopic}); err != nil {
		return nil, fmt.Errorf("workflow: producer: %w", err)
	}
	s.relay = outbox.NewRelay(s.pool, s.producer, log)

	meter := otel.Meter("github.com/razorbill/flo/services/workflow")
	cat := catalog.New(s.pool, cfg.MaxWorkflowVersionsPerNamespace)
	cat.SetClock(o.now)
	s.runner, err = runner.New(s.pool, cat, s.relay, runner.Config{
		MaxPayloadBytes: cfg.MaxPayloadBytes, SafetyTick: cfg.TimerTick, MaxPendingSignalsPerNamespace: cfg.MaxPendingSignalsPerNamespace,
	}, log, meter)
	if err != nil {
		return nil, fmt.Errorf("workflow: %w", err)
	}
	if s.gauges, err = runner.NewGauges(s.pool, meter); err != nil {
		return nil, fmt.Errorf("workflow: %w", err)
	}
	s.timers = timer.NewLoop(s.runner, cfg.TimerTick, log)
	s.runner.SetTimerWaker(s.timers)
	scheduleTick := cfg.ScheduleTick
	if scheduleTick == 0 {
		scheduleTick = defaultScheduleTick
	}
	s.schedules = schedule.NewLoop(s.runner, o.now, scheduleTick, log)
	s.listener = wake.NewListener(pg.Dialer(s.pool), map[string]func(string){
		store.TimersChannel:    func(string) { s.timers.WakeNow() },
		store.SchedulesChannel: func(string) { s.schedules.WakeNow() },
	}, func() {
		s.timers.WakeNow()
		s.schedules.WakeNow()
	}, log)

	if cfg.StreamsAddr != "" {
		if s.streamsConn, err = dialStreams(cfg.StreamsAddr, cfg.Auth, log); err != nil {
			return nil, fmt.Errorf("workflow: %w", err)
		}
		if s.triggers, err = trigger.NewManager(cat, s.runner, streamsv1.NewStreamsClient(s.streamsConn), trigger.Config{MessageTimeout: cfg.TriggerTimeout}, log, meter); err != nil {
			return nil, fmt.Errorf("workflow: %w", err)
		}
	}

	if s.grpcServer, err = grpcapi.NewGRPCServer(cat, s.runner, log, cfg.Auth); err != nil {
		return nil, fmt.Errorf("workflow: %w", err)
	}
	if s.grpcLis, s.httpLis, err = stage.Listen(cfg.GRPCAddr, cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("workflow: %w", err)
	}
	s.httpServer = &http.Server{Handler: probe.Handler(s.ready(), o.metrics), ReadHeaderTimeout: 10 * time.Second}
	// Last, because a consumer's client is only released by its Run.
	if s.consumer, err = kafka.NewConsumer(cfg.Kafka, runner.ConsumerGroup, []string{kafka.TaskOutcomesTopic}, s.runner.HandleTaskEvents, log,
		kgo.FetchMinBytes(runner.FetchMinBytes), kgo.FetchMaxWait(runner.FetchMaxWait)); err != nil {
		return nil, fmt.Errorf("workflow: %w", err)
	}
	// Dispatchers of earlier versions wrote outcomes only into the task
	// events, which this service's earlier versions read.
	s.consumer.TakeOverTaskOutcomes()
	return s, nil
}

func validate(cfg Config) error {
	switch {
	case cfg.Postgres.URL == "":
		return errors.New("workflow: FLO_DATABASE_URL is required")
	case len(cfg.Kafka.Brokers) == 0:
		return errors.New("workflow: FLO_KAFKA_BROKERS is required")
	case cfg.MaxPayloadBytes <= 0:
		return fmt.Errorf("workflow: FLO_MAX_PAYLOAD_BYTES must be positive, got %d", cfg.MaxPayloadBytes)
	case cfg.TimerTick <= 0 || cfg.TimerTick > time.Minute:
		return fmt.Errorf("workflow: FLO_WORKFLOW_TIMER_TICK must be between 0 and 1m, got %s", cfg.TimerTick)
	case cfg.ScheduleTick < 0 || cfg.ScheduleTick > time.Minute:
		return fmt.Errorf("workflow: FLO_WORKFLOW_SCHEDULE_TICK must be between 0 and 1m, got %s", cfg.ScheduleTick)
	case cfg.TriggerTimeout < 0 || cfg.TriggerTimeout > time.Hour:
		return fmt.Errorf("workflow: FLO_WORKFLOW_TRIGGER_TIMEOUT must be between 0 and 1h, got %s", cfg.TriggerTimeout)
	}
	if err := internalauth.Validate(cfg.Auth); err != nil {
		return fmt.Errorf("workflow: %w", err)
	}
	return nil
}

// GRPCAddr is the address the gRPC server listens on.
func (s *Service) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the address of /healthz, /readyz and /metrics.
func (s *Service) HTTPAddr() string { return s.httpLis.Addr().String() }

// Run serves until ctx ends or a component fails, then stops in order:
// readiness off (serving on for Shutdown.Delay), gRPC drained, the consumer
// stopped (committing what it handled), the runner and timers stopped, the
// outbox flushed, HTTP stopped and connections closed. Every change of a run
// is committed with its outbox rows, so stopping at any point loses nothing.
func (s *Service) Run(ctx context.Context) error {
	s.consuming.Store(true)
	// Triggers stop before the runner, finishing the starts in hand.
	triggers := stage.New("triggers")
	if s.triggers != nil {
		triggers.Go("stream triggers", s.triggers.Run)
	}
	err := stage.Run(ctx, s.log,
		stage.HTTP(s.httpServer, s.httpLis, httpStopTimeout, s.log),
		stage.New("relay").
			Go("outbox relay", s.relay.Run).
			OnStop(s.relay.FlushAtStop(relayFlushWait)),
		stage.New("work").
			Go("runner", s.runner.Run).
			Go("run gauges", s.gauges.Run).
			Go("timer loop", s.timers.Run).
			Go("scheduler", s.schedules.Run).
			Go("timer listener", s.listener.Run).
			Go("plan sweep", func(ctx context.Context) error {
				return sweep.Every(ctx, planSweepInterval, s.log, "sweep expired plan cache entries and rate windows", s.runner.SweepPlans)
			}),
		triggers,
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
	if s.streamsConn != nil {
		_ = s.streamsConn.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
}

// streamsRedialMax caps the wait between attempts to reach a streams
// service that is down, so triggers resume soon after it is back (gRPC's own
// cap is two minutes).
const streamsRedialMax = time.Second

// dialStreams connects (lazily) to the streams service with the internal
// credential. Keepalive as the gateway's, since group reads block.
func dialStreams(addr string, auth config.Auth, log *slog.Logger) (*grpc.ClientConn, error) {
	opts, err := internalauth.DialOptions(auth, log)
	if err != nil {
		return nil, fmt.Errorf("dial streams service: %w", err)
	}
	conn, err := grpc.NewClient(addr, append(opts,
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: streamsRedialMax},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Minute, Timeout: 20 * time.Second}),
	)...)
	if err != nil {
		return nil, fmt.Errorf("dial streams service %s: %w", addr, err)
	}
	return conn, nil
}

// ready reports whether the service can do its work: not stopping, the
// database answering and the task-outcomes consumer running.
func (s *Service) ready() func(context.Context) error {
	return probe.All(probe.Unset(&s.stopping, "stopping"), probe.Set(&s.consuming, "task outcomes consumer not running"), func(ctx context.Context) error { return s.consumer.HandedOver(ctx) }, probe.Ping("database", s.pool, readyPingTimeout))
}
