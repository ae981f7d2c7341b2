package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/localbroker"
	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/streams/service"
)

func TestMain(m *testing.M) {
	// The gateway's trace context reaches the service in gRPC metadata,
	// extracted with the global propagator, as telemetry.Setup installs it.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	os.Exit(harness.Main(m))
}

const (
	waitFor = 20 * time.Second
	tick    = 10 * time.Millisecond
	// maxRecord is the payload limit of test services.
	maxRecord = 64 << 10
)

// env is a database and a broker, with one or more services on them.
type env struct {
	dbURL  string
	broker *localbroker.Broker
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return &env{dbURL: harness.NewDatabase(t), broker: harness.NewBroker(t)}
}

func (e *env) config() service.Config {
	return service.Config{
		GRPCAddr:       "127.0.0.1:0",
		HTTPAddr:       "127.0.0.1:0",
		MaxRecordBytes: maxRecord,
		ReadCacheBytes: 16 << 20,
		Postgres:       config.Postgres{URL: e.dbURL, MaxConns: 8},
		Kafka:          config.Kafka{Brokers: e.broker.Addrs(), Partitions: 4},
		Auth:           harness.InternalAuth(),
	}
}

// replica is one running streams service and a client of it.
type replica struct {
	svc    *service.Service
	client streamsv1.StreamsClient
	stop   func()
}

// start runs a service on e; stop shuts it down gracefully and checks Run
// returned nil. It is also called at the end of the test.
func (e *env) start(t testing.TB, cfg service.Config) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	svc, err := service.New(ctx, cfg, log)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	conn := harness.DialInternal(t, svc.GRPCAddr(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	var stopped atomic.Bool
	stop := func() {
		if stopped.Swap(true) {
			return
		}
		_ = conn.Close()
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(waitFor):
			t.Error("streams service did not stop")
		}
	}
	t.Cleanup(stop)
	return &replica{svc: svc, client: streamsv1.NewStreamsClient(conn), stop: stop}
}

// topicOf is the log topic of a stream, read from the service's tables.
func (e *env) topicOf(t *testing.T, ns, stream string) string {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), e.dbURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(t.Context()))
	var id int64
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT id FROM streams.streams WHERE namespace = $1 AND name = $2`, ns, stream).Scan(&id))
	return fmt.Sprintf("flo.stream.%d", id)
}

var nsSeq atomic.Int64

// namespace returns a namespace no other test uses.
func namespace() string { return fmt.Sprintf("ns-%d", nsSeq.Add(1)) }

func requireCode(t *testing.T, want codes.Code, err error, msg string) {
	t.Helper()
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status: %v", err)
	require.Equal(t, want, st.Code(), "message: %s", st.Message())
	require.Contains(t, st.Message(), msg)
}

func createStream(t testing.TB, c streamsv1.StreamsClient, ns, name string, partitions int32) *flov1.Stream {
	t.Helper()
	st, err := c.CreateStream(t.Context(), &flov1.CreateStreamRequest{Namespace: ns, Name: name, Partitions: partitions})
	require.NoError(t, err)
	return st
}

func createGroup(t testing.TB, c streamsv1.StreamsClient, ns, stream, name, start string, maxDeliveries int32) *flov1.ConsumerGroup {
	t.Helper()
	g, err := c.CreateGroup(t.Context(), &flov1.CreateGroupRequest{Namespace: ns, Stream: stream, Name: name, Start: start, MaxDeliveries: maxDeliveries})
	require.NoError(t, err)
	return g
}

// appendN appends n records with payloads {"n": from+i} and returns their ids.
func appendN(t *testing.T, c streamsv1.StreamsClient, ns, stream string, from, n int) []string {
	t.Helper()
	req := &flov1.AppendRequest{Namespace: ns, Stream: stream}
	for i := range n {
		req.Records = append(req.Records, &flov1.AppendRecord{Payload: fmt.Appendf(nil, `{"n":%d}`, from+i)})
	}
	resp, err := c.Append(t.Context(), req)
	require.NoError(t, err)
	require.Len(t, resp.GetIds(), n)
	return resp.GetIds()
}

func groupRead(t *testing.T, c streamsv1.StreamsClient, ns, stream, group, consumer string, count int32, block, timeout time.Duration) []*flov1.StreamRecord {
	t.Helper()
	resp, err := c.GroupRead(t.Context(), &flov1.GroupReadRequest{
		Namespace: ns, Stream: stream, Group: group, Consumer: consumer, Count: count,
		BlockMs: block.Milliseconds(), MessageTimeoutMs: timeout.Milliseconds(),
	})
	require.NoError(t, err)
	return resp.GetRecords()
}

func ack(t *testing.T, c streamsv1.StreamsClient, ns, stream, group string, ids ...string) int32 {
	t.Helper()
	resp, err := c.Ack(t.Context(), &flov1.AckRequest{Namespace: ns, Stream: stream, Group: group, Ids: ids})
	require.NoError(t, err)
	return resp.GetAcked()
}

func ids(recs []*flov1.StreamRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.GetId()
	}
	return out
}
