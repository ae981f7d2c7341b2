package devstack_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/localbroker"
	"github.com/razorbill/flo/services/devstack"
)

// testAdminToken is the admin key of every stack these tests start. TestMain
// hands it to the SDK and the CLI as FLO_TOKEN, as a user's shell would.
const testAdminToken = "flo_admin_devstack-test-token"

func TestMain(m *testing.M) {
	if err := os.Setenv("FLO_TOKEN", testAdminToken); err != nil {
		panic(err)
	}
	code := harness.Main(m)
	// The service binaries are built once per run (serviceBinaries), about
	// 150 MB; left behind, every run would add another copy.
	if binDir != "" {
		if err := os.RemoveAll(binDir); err != nil {
			fmt.Fprintf(os.Stderr, "remove %s: %v\n", binDir, err)
		}
	}
	os.Exit(code)
}

// env is one test's platform: its own database and broker, every service.
type env struct {
	stack  *devstack.Stack
	broker *localbroker.Broker
	db     *pgxpool.Pool
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newEnv(t *testing.T) *env { return newEnvWith(t, nil) }

// newEnvWith starts a platform with test-friendly settings that adjust may
// change, and opts.
func newEnvWith(t *testing.T, adjust func(cfg *devstack.Config), opts ...devstack.Option) *env {
	t.Helper()
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	cfg := devstack.Config{
		DatabaseURL:         dbURL,
		Kafka:               config.Kafka{Brokers: broker.Addrs(), Partitions: 4},
		Namespaces:          []string{"default", "myapp"},
		HeartbeatTimeout:    90 * time.Second,
		HealthCheckInterval: time.Second,
		MaxPayloadBytes:     64 << 10,
		AdminToken:          testAdminToken,
	}
	cfg.OnEphemeralPorts()
	if adjust != nil {
		adjust(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stack, err := devstack.Start(ctx, cfg, testLogger(t), opts...)
	require.NoError(t, err)
	t.Cleanup(stack.Stop)
	return &env{stack: stack, broker: broker, db: openPool(t, dbURL)}
}

// bearer sends the test admin key with every call of a raw connection.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// dial opens a raw gRPC connection carrying the test admin key, for calls the
// SDK does not make.
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearer(testAdminToken)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// openPool connects the test itself to the database, to check what the
// services stored.
func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	db, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return db
}

// client connects an SDK client to the gateway, with the key from FLO_TOKEN
// as TestMain set it: the way a user's program gets it.
func (e *env) client(t *testing.T, ns string) *flo.Client {
	t.Helper()
	c := flo.NewClient(e.stack.GatewayGRPCAddr(), flo.WithNamespace(ns))
	require.NoError(t, c.Connect())
	t.Cleanup(func() { c.Close() })
	return c
}

// worker starts an ActionWorker with the given handlers; it stops at cleanup
// or when the returned cancel is called.
func (e *env) worker(t *testing.T, ns string, opts flo.ActionWorkerOptions, register func(w *flo.ActionWorker)) (stop func()) {
	t.Helper()
	c := e.client(t, ns)
	w, err := c.NewActionWorker(opts)
	require.NoError(t, err)
	register(w)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("worker did not stop")
		}
	}
	t.Cleanup(stop)
	return stop
}

// taskState reads a task's state and attempt straight from the dispatcher's
// table; an empty state means the invocation has not reached it yet.
func (e *env) taskState(t *testing.T, id string) (state string, attempt int) {
	t.Helper()
	err := e.db.QueryRow(context.Background(),
		`SELECT state, attempt FROM dispatcher.tasks WHERE id = $1`, id).Scan(&state, &attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0
	}
	require.NoError(t, err)
	return state, attempt
}

// countByState counts tasks per state in a namespace.
func (e *env) countByState(t *testing.T, ns string) map[string]int {
	t.Helper()
	rows, err := e.db.Query(context.Background(),
		`SELECT state, count(*) FROM dispatcher.tasks WHERE namespace = $1 GROUP BY state`, ns)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		require.NoError(t, rows.Scan(&s, &n))
		out[s] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// restCall calls the gateway's REST facade at url as the test admin: with
// the key, and body (when not nil) as JSON.
func restCall(method, url string, body []byte) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		return nil, fmt.Errorf("REST request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return http.DefaultClient.Do(req)
}
