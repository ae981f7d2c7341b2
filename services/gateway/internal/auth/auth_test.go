package auth_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/keyformat"
	"github.com/razorbill/flo/services/gateway/internal/auth"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

const adminToken = "test-admin-token"

// store is a key store in memory, standing in for the dispatcher's keys
// table behind the KeyLookup contract.
type store struct {
	mu      sync.Mutex
	keys    map[string]auth.StoredKey
	lookups int
	down    bool
}

func (s *store) lookup(_ context.Context, id string) (auth.StoredKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups++
	if s.down {
		return auth.StoredKey{}, errors.New("dispatcher unavailable")
	}
	k, ok := s.keys[id]
	if !ok {
		return auth.StoredKey{}, auth.ErrKeyNotFound
	}
	return k, nil
}

// add makes a key of role in ns and returns its bearer text.
func (s *store) add(t *testing.T, ns string, role auth.Role, change func(*auth.StoredKey)) string {
	t.Helper()
	k, err := keyformat.Generate()
	require.NoError(t, err)
	sk := auth.StoredKey{ID: k.ID, Namespace: ns, Role: role, SecretHash: keyformat.Hash(k.Secret)}
	if change != nil {
		change(&sk)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[k.ID] = sk
	return k.String()
}

func (s *store) update(id string, change func(*auth.StoredKey)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[id]
	change(&k)
	s.keys[id] = k
}

func (s *store) setDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

func (s *store) lookupCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups
}

func keyID(t *testing.T, key string) string {
	t.Helper()
	k, err := keyformat.Parse(key)
	require.NoError(t, err)
	return k.ID
}

type env struct {
	guard *auth.Guard
	store *store
	clock *harness.Clock
}

func newEnv(t *testing.T, change func(*auth.Options)) *env {
	t.Helper()
	e := &env{store: &store{keys: map[string]auth.StoredKey{}}, clock: harness.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	opts := auth.Options{AdminToken: adminToken, Lookup: e.store.lookup, Now: e.clock.Now, Log: slog.New(slog.DiscardHandler)}
	if change != nil {
		change(&opts)
	}
	g, err := auth.New(opts)
	require.NoError(t, err)
	e.guard = g
	return e
}

// taskServer answers InvokeTask with the caller's key id, and GetTask with
// its namespace, so tests see the principal the handler got.
type taskServer struct {
	flov1.UnimplementedTaskServiceServer
}

func (taskServer) InvokeTask(ctx context.Context, _ *flov1.InvokeTaskRequest) (*flov1.InvokeTaskResponse, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no principal")
	}
	return &flov1.InvokeTaskResponse{TaskId: p.KeyID}, nil
}

func (taskServer) GetTask(ctx context.Context, req *flov1.GetTaskRequest) (*flov1.Task, error) {
	return &flov1.Task{Namespace: req.GetNamespace(), Id: req.GetTaskId()}, nil
}

// workerServer checks the Hello's namespace the way the worker stream does.
type workerServer struct {
	flov1.UnimplementedWorkerServiceServer
}

func (workerServer) Stream(stream grpc.BidiStreamingServer[flov1.WorkerMessage, flov1.ServerMessage]) error {
	msg, err := stream.Recv()
	if err != nil {
		return err
	}
	if err := auth.Check(stream.Context(), flov1.WorkerService_Stream_FullMethodName, msg.GetHello().GetNamespace()); err != nil {
		return err
	}
	return stream.Send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_HelloAck{HelloAck: &flov1.HelloAck{}}})
}

// serveGRPC serves the test services behind the guard on 127.0.0.1:0.
func serveGRPC(t *testing.T, g *auth.Guard) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.UnaryInterceptor(g.UnaryInterceptor()), grpc.StreamInterceptor(g.StreamInterceptor()))
	flov1.RegisterTaskServiceServer(srv, taskServer{})
	flov1.RegisterWorkerServiceServer(srv, workerServer{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func withKey(ctx context.Context, key string) context.Context {
	if key == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
}

func TestUnaryChecksKeyRoleAndNamespace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	conn := serveGRPC(t, e.guard)
	tasks := flov1.NewTaskServiceClient(conn)

	clientKey := e.store.add(t, "a", auth.RoleClient, nil)
	readKey := e.store.add(t, "a", auth.RoleRead, nil)
	workerKey := e.store.add(t, "a", auth.RoleWorker, nil)
	otherNS := e.store.add(t, "b", auth.RoleClient, nil)
	revoked := e.store.add(t, "a", auth.RoleClient, func(k *auth.StoredKey) { k.Revoked = true })
	expired := e.store.add(t, "a", auth.RoleClient, func(k *auth.StoredKey) { k.ExpiresAt = e.clock.Now() })
	notYetExpired := e.store.add(t, "a", auth.RoleClient, func(k *auth.StoredKey) { k.ExpiresAt = e.clock.Now().Add(time.Hour) })
	unknown, err := keyformat.Generate()
	require.NoError(t, err)
	wrongSecret := "flo_" + keyID(t, clientKey) + "_" + unknown.Secret
	adminKey := e.store.add(t, "", auth.RoleAdmin, nil)

	tests := []struct {
		name string
		key  string
		ns   string
		want codes.Code
	}{
		{name: "missing key", key: "", ns: "a", want: codes.Unauthenticated},
		{name: "malformed key", key: "flo_nope", ns: "a", want: codes.Unauthenticated},
		{name: "unknown key", key: unknown.String(), ns: "a", want: codes.Unauthenticated},
		{name: "wrong secret", key: wrongSecret, ns: "a", want: codes.Unauthenticated},
		{name: "revoked key", key: revoked, ns: "a", want: codes.Unauthenticated},
		{name: "expired key", key: expired, ns: "a", want: codes.Unauthenticated},
		{name: "key of another namespace", key: otherNS, ns: "a", want: codes.PermissionDenied},
		{name: "read key may not invoke", key: readKey, ns: "a", want: codes.PermissionDenied},
		{name: "worker key may not invoke", key: workerKey, ns: "a", want: codes.PermissionDenied},
		{name: "client key of the namespace", key: clientKey, ns: "a", want: codes.OK},
		{name: "key before its expiry", key: notYetExpired, ns: "a", want: codes.OK},
		{name: "admin key, any namespace", key: adminKey, ns: "b", want: codes.OK},
		{name: "admin token", key: adminToken, ns: "b", want: codes.OK},
		{name: "admin token with a wrong last byte", key: adminToken[:len(adminToken)-1] + "X", ns: "b", want: codes.Unauthenticated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tasks.InvokeTask(withKey(t.Context(), tc.key), &flov1.InvokeTaskRequest{Namespace: tc.ns, Action: "x"})
			require.Equal(t, tc.want, status.Code(err), "%v", err)
		})
	}

	resp, err := tasks.InvokeTask(withKey(t.Context(), adminToken), &flov1.InvokeTaskRequest{Namespace: "a"})
	require.NoError(t, err)
	require.Equal(t, "admin", resp.GetTaskId(), "the admin token's principal is key id admin")
	resp, err = tasks.InvokeTask(withKey(t.Context(), clientKey), &flov1.InvokeTaskRequest{Namespace: "a"})
	require.NoError(t, err)
	require.Equal(t, keyID(t, clientKey), resp.GetTaskId())

	_, err = tasks.GetTask(withKey(t.Context(), readKey), &flov1.GetTaskRequest{Namespace: "a", TaskId: "t"})
	require.NoError(t, err, "a read key reads its namespace")
	_, err = tasks.GetTask(withKey(t.Context(), workerKey), &flov1.GetTaskRequest{Namespace: "a", TaskId: "t"})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "a worker key does not read tasks")
}

func TestStreamChecksRoleAndHelloNamespace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	workers := flov1.NewWorkerServiceClient(serveGRPC(t, e.guard))
	workerKey := e.store.add(t, "a", auth.RoleWorker, nil)
	clientKey := e.store.add(t, "a", auth.RoleClient, nil)

	hello := func(key, ns string) error {
		stream, err := workers.Stream(withKey(t.Context(), key))
		require.NoError(t, err)
		// A stream refused at once ends before the Hello: Send sees EOF and
		// Recv the status.
		if err := stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{Namespace: ns}}}); !errors.Is(err, io.EOF) {
			require.NoError(t, err)
		}
		_, err = stream.Recv()
		return err
	}
	require.NoError(t, hello(workerKey, "a"))
	require.NoError(t, hello(adminToken, "b"))
	require.Equal(t, codes.PermissionDenied, status.Code(hello(workerKey, "b")))
	require.Equal(t, codes.PermissionDenied, status.Code(hello(clientKey, "a")))
	require.Equal(t, codes.Unauthenticated, status.Code(hello("", "a")))
}

func TestRateLimitPerKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(o *auth.Options) { o.Rates = map[auth.Role]float64{auth.RoleClient: 1} })
	tasks := flov1.NewTaskServiceClient(serveGRPC(t, e.guard))
	limited := e.store.add(t, "a", auth.RoleClient, nil)
	other := e.store.add(t, "a", auth.RoleClient, nil)
	invoke := func(key string, trailer *metadata.MD) error {
		_, err := tasks.InvokeTask(withKey(t.Context(), key), &flov1.InvokeTaskRequest{Namespace: "a"}, grpc.Trailer(trailer))
		return err
	}

	var md metadata.MD
	require.NoError(t, invoke(limited, &md), "the burst is twice the rate")
	require.NoError(t, invoke(limited, &md))
	err := invoke(limited, &md)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Equal(t, []string{"1"}, md.Get("retry-after"))

	require.NoError(t, invoke(other, &md), "another key is served while one is limited")
	require.NoError(t, invoke(adminToken, &md), "admin is unlimited by default")

	e.clock.Advance(time.Second)
	require.NoError(t, invoke(limited, &md), "a second later the bucket has a token again")
}

func TestKeyCache(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tasks := flov1.NewTaskServiceClient(serveGRPC(t, e.guard))
	key := e.store.add(t, "a", auth.RoleClient, nil)
	invoke := func(key string) codes.Code {
		_, err := tasks.InvokeTask(withKey(t.Context(), key), &flov1.InvokeTaskRequest{Namespace: "a"})
		return status.Code(err)
	}

	require.Equal(t, codes.OK, invoke(key))
	e.store.update(keyID(t, key), func(k *auth.StoredKey) { k.Revoked = true })
	e.clock.Advance(1900 * time.Millisecond)
	require.Equal(t, codes.OK, invoke(key), "within the TTL the cached key is used")
	e.clock.Advance(100 * time.Millisecond)
	require.Equal(t, codes.Unauthenticated, invoke(key), "a revoke is seen once the TTL has passed")

	unknown, err := keyformat.Generate()
	require.NoError(t, err)
	before := e.store.lookupCount()
	require.Equal(t, codes.Unauthenticated, invoke(unknown.String()))
	require.Equal(t, codes.Unauthenticated, invoke(unknown.String()))
	require.Equal(t, before+1, e.store.lookupCount(), "an unknown id is cached too")

	// While the store cannot be asked, the last answer stands; a key never
	// seen cannot be checked.
	live := e.store.add(t, "a", auth.RoleClient, nil)
	require.Equal(t, codes.OK, invoke(live))
	e.store.setDown(true)
	e.clock.Advance(time.Minute)
	require.Equal(t, codes.OK, invoke(live))
	require.Equal(t, codes.Unauthenticated, invoke(key), "the revoked key stays refused")
	fresh := e.store.add(t, "a", auth.RoleClient, nil)
	require.Equal(t, codes.Unavailable, invoke(fresh))
}

func TestOffIsAnonymousAdmin(t *testing.T) {
	t.Parallel()
	g, err := auth.New(auth.Options{Off: true})
	require.NoError(t, err)
	tasks := flov1.NewTaskServiceClient(serveGRPC(t, g))
	resp, err := tasks.InvokeTask(t.Context(), &flov1.InvokeTaskRequest{Namespace: "a"})
	require.NoError(t, err)
	require.Equal(t, "anonymous", resp.GetTaskId())
}

func TestNewRefusesNoAdminToken(t *testing.T) {
	t.Parallel()
	_, err := auth.New(auth.Options{Lookup: (&store{}).lookup})
	require.ErrorContains(t, err, "FLO_ADMIN_TOKEN")
	_, err = auth.New(auth.Options{AdminToken: "x"})
	require.Error(t, err)
}
