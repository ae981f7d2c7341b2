package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/razorbill/flo/libs/certs"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/internalauth"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/localbroker"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	dispatcher "github.com/razorbill/flo/services/dispatcher/service"
	registry "github.com/razorbill/flo/services/registry/service"
	streams "github.com/razorbill/flo/services/streams/service"

	"github.com/razorbill/flo/services/gateway/internal/auth"
	"github.com/razorbill/flo/services/gateway/service"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// adminToken is the admin key of the test stacks; the stack's gRPC
// connection and REST helpers send it.
const adminToken = "flo-test-admin-token"

// testMaxPayload keeps the payload limit small so oversized requests are
// cheap to build.
const testMaxPayload = 4096

// wait bounds every wait in these tests; it only keeps a broken test from
// hanging, nothing asserts how long anything took.
const wait = 60 * time.Second

// testMaxWorkers is the registry's per-namespace worker limit in the test
// stacks, small so the limit is cheap to reach.
const testMaxWorkers = 5

// stack is a dispatcher, a gateway and, when asked for, a registry and a
// streams service on loopback over a fresh database and broker.
type stack struct {
	gateway      *service.Service
	stopGateway  func() error
	dispatcher   dispatcherv1.DispatcherClient
	dispatchAddr string
	stopDispatch func() error
	registryAddr string
	stopRegistry func() error
	streamsAddr  string
	stopStreams  func() error
	workflowAddr string
	dbURL        string
	broker       *localbroker.Broker
	brokers      []string
	conn         *grpc.ClientConn
	base         string
	// http is the REST client, trusting the stack's CA when it has TLS.
	http *http.Client
	// auth is every service's auth setting.
	auth config.Auth
	log  *slog.Logger

	namespaces flov1.NamespaceServiceClient
	actions    flov1.ActionServiceClient
	tasks      flov1.TaskServiceClient
	workers    flov1.WorkerServiceClient
	registry   flov1.WorkerRegistryServiceClient
	streams    flov1.StreamServiceClient
	workflows  flov1.WorkflowServiceClient
}

// stackOptions say which optional services a stack runs. Without a streams
// or workflow service the gateway is configured with none.
type stackOptions struct {
	registry bool
	streams  bool
	workflow bool
	// tls, when set, puts the gateway's public ports on TLS.
	tls *edgeFiles
	// maxWorkerStreams and maxConcurrentStreams are the gateway's limits;
	// zero is the default.
	maxWorkerStreams     int
	maxConcurrentStreams uint32
	// authOff runs every service with FLO_AUTH=off and the gateway without
	// an admin token.
	authOff bool
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// run starts a component's Run and returns a function that stops it and
// returns Run's error; the test's cleanup stops it too if the test did not.
func run(t *testing.T, r func(context.Context) error) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { require.NoError(t, stop()) })
	return stop
}

// startStack starts a dispatcher and a gateway whose registry address has
// nothing listening: the registry is down, as it may be in production.
func startStack(t *testing.T) *stack {
	t.Helper()
	return newStack(t, stackOptions{})
}

// startRegistryStack starts a dispatcher, a registry and a gateway.
func startRegistryStack(t *testing.T) *stack {
	t.Helper()
	return newStack(t, stackOptions{registry: true})
}

// startStreamsStack starts a dispatcher, a streams service and a gateway;
// with registry, a registry too.
func startStreamsStack(t *testing.T, registry bool) *stack {
	t.Helper()
	return newStack(t, stackOptions{registry: registry, streams: true})
}

func newStack(t *testing.T, opts stackOptions) *stack {
	t.Helper()
	broker := harness.NewBroker(t)
	s := &stack{dbURL: harness.NewDatabase(t), broker: broker, brokers: broker.Addrs(), log: testLogger(t), dispatchAddr: "127.0.0.1:0", auth: harness.InternalAuth()}
	if opts.authOff {
		s.auth = config.Auth{Mode: "off"}
	}
	s.startDispatcher(t)
	if opts.registry {
		s.startRegistry(t)
	} else {
		s.registryAddr = harness.DeadPeer(t)
	}
	if opts.streams {
		s.startStreams(t)
	}
	if opts.workflow {
		s.startWorkflow(t)
	}

	cfg := service.Config{
		GRPCAddr:             "127.0.0.1:0",
		HTTPAddr:             "127.0.0.1:0",
		DispatcherAddr:       s.dispatchAddr,
		RegistryAddr:         s.registryAddr,
		StreamsAddr:          s.streamsAddr,
		WorkflowAddr:         s.workflowAddr,
		MetricsAddr:          "127.0.0.1:0",
		MaxPayloadBytes:      testMaxPayload,
		MaxWorkerStreams:     opts.maxWorkerStreams,
		MaxConcurrentStreams: opts.maxConcurrentStreams,
		Auth:                 s.auth,
		APIKeys:              auth.Config{AdminToken: adminToken},
		Kafka:                s.kafka(),
	}
	if opts.authOff {
		cfg.APIKeys.AdminToken = ""
	}
	transport, scheme := insecure.NewCredentials(), "http://"
	s.http = http.DefaultClient
	if opts.tls != nil {
		cfg.TLSCertFile, cfg.TLSKeyFile = opts.tls.cert, opts.tls.key
		clientTLS, err := certs.Client(opts.tls.ca)
		require.NoError(t, err)
		transport, scheme = credentials.NewTLS(clientTLS), "https://"
		s.http = &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}}
	}
	gw, err := service.New(context.Background(), cfg, s.log.With("service", "gateway"))
	require.NoError(t, err)
	s.gateway = gw
	s.stopGateway = run(t, gw.Run)

	s.conn, err = grpc.NewClient(gw.GRPCAddr(), grpc.WithTransportCredentials(transport), grpc.WithPerRPCCredentials(harness.Bearer(adminToken)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.conn.Close() })
	dconn := dialInternal(t, s.dispatchAddr)
	require.Eventually(t, gw.Ready, wait, 10*time.Millisecond, "gateway never became ready")

	s.base = scheme + gw.HTTPAddr()
	s.dispatcher = dispatcherv1.NewDispatcherClient(dconn)
	s.namespaces = flov1.NewNamespaceServiceClient(s.conn)
	s.actions = flov1.NewActionServiceClient(s.conn)
	s.tasks = flov1.NewTaskServiceClient(s.conn)
	s.workers = flov1.NewWorkerServiceClient(s.conn)
	s.registry = flov1.NewWorkerRegistryServiceClient(s.conn)
	s.streams = flov1.NewStreamServiceClient(s.conn)
	s.workflows = flov1.NewWorkflowServiceClient(s.conn)
	return s
}

// dialInternal connects to an internal service's gRPC port with the
// internal credential, as the gateway does.
func dialInternal(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	opts, err := internalauth.DialOptions(harness.InternalAuth(), nil)
	require.NoError(t, err)
	conn, err := grpc.NewClient(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// startRegistry starts a registry over the stack's database and broker.
func (s *stack) startRegistry(t *testing.T) {
	t.Helper()
	reg, err := registry.New(context.Background(), registry.Config{
		GRPCAddr:               "127.0.0.1:0",
		HTTPAddr:               "127.0.0.1:0",
		HeartbeatTimeout:       90 * time.Second,
		HealthCheckInterval:    time.Second,
		MaxWorkersPerNamespace: testMaxWorkers,
		Postgres:               config.Postgres{URL: s.dbURL, MaxConns: 8},
		Auth:                   s.auth,
		Kafka:                  s.kafka(),
	}, s.log.With("service", "registry"))
	require.NoError(t, err)
	s.registryAddr = reg.GRPCAddr()
	s.stopRegistry = run(t, reg.Run)
}

// startStreams starts a streams service over the stack's database and
// broker; after the first start its address is fixed, so a restarted one is
// found again. Its record limit is above the gateway's payload limit, so an
// oversized record is the gateway's to refuse.
func (s *stack) startStreams(t *testing.T) {
	t.Helper()
	addr := s.streamsAddr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	svc, err := streams.New(context.Background(), streams.Config{
		GRPCAddr:       addr,
		HTTPAddr:       "127.0.0.1:0",
		MaxRecordBytes: 2 * testMaxPayload,
		Postgres:       config.Postgres{URL: s.dbURL, MaxConns: 8},
		Auth:           s.auth,
		Kafka:          s.kafka(),
	}, s.log.With("service", "streams"))
	require.NoError(t, err)
	s.streamsAddr = svc.GRPCAddr()
	s.stopStreams = run(t, svc.Run)
}

func (s *stack) kafka() config.Kafka { return config.Kafka{Brokers: s.brokers, Partitions: 2} }

// startDispatcher starts a dispatcher on s.dispatchAddr; after the first
// start that address is fixed, so a restarted dispatcher is found again.
func (s *stack) startDispatcher(t *testing.T) {
	t.Helper()
	disp, err := dispatcher.New(context.Background(), dispatcher.Config{
		GRPCAddr:            s.dispatchAddr,
		HTTPAddr:            "127.0.0.1:0",
		BootstrapNamespaces: []string{"default"},
		Postgres:            config.Postgres{URL: s.dbURL, MaxConns: 8},
		Auth:                s.auth,
		Kafka:               s.kafka(),
	}, s.log.With("service", "dispatcher"))
	require.NoError(t, err)
	s.dispatchAddr = disp.GRPCAddr()
	s.stopDispatch = run(t, disp.Run)
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

// restResponse is an HTTP answer with its JSON body decoded.
type restResponse struct {
	status int
	body   map[string]any
	raw    []byte
}

func (s *stack) rest(t *testing.T, method, path string, body any) restResponse {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = bytes.NewReader([]byte(b))
	default:
		data, err := json.Marshal(b)
		require.NoError(t, err)
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(testContext(t), method, s.base+path, rd)
	require.NoError(t, err)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := s.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := restResponse{status: resp.StatusCode, raw: raw}
	if len(raw) > 0 && raw[0] == '{' {
		require.NoError(t, json.Unmarshal(raw, &out.body), "body: %s", raw)
	}
	return out
}

// commandKeys returns the keys (task ids) of every command on
// flo.actions.commands (see commandRecords).
func commandKeys(t *testing.T, brokers []string) []string {
	t.Helper()
	keys := []string{}
	for _, r := range commandRecords(t, brokers) {
		keys = append(keys, string(r.Key))
	}
	return keys
}

// commandRecords returns every command on flo.actions.commands: it reads
// from the start up to the end offsets listed when it is called, which cover
// every produce acknowledged before.
func commandRecords(t *testing.T, brokers []string) []*kgo.Record {
	t.Helper()
	ctx := testContext(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	require.NoError(t, err)
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, kafka.CommandsTopic)
	require.NoError(t, err)
	require.NoError(t, ends.Error())
	start := map[string]map[int32]kgo.Offset{kafka.CommandsTopic: {}}
	remaining := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			start[o.Topic][o.Partition] = kgo.NewOffset().AtStart()
			remaining[o.Partition] = o.Offset
		}
	})
	var records []*kgo.Record
	if len(remaining) == 0 {
		return records
	}
	cl.AddConsumePartitions(start)
	for len(remaining) > 0 {
		fetches := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "did not reach the end offsets")
		fetches.EachRecord(func(r *kgo.Record) {
			end, ok := remaining[r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			records = append(records, r)
			if r.Offset == end-1 {
				delete(remaining, r.Partition)
			}
		})
	}
	return records
}
