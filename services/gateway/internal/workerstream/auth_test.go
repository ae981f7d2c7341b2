package workerstream

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"

	"github.com/razorbill/flo/libs/keyformat"
	"github.com/razorbill/flo/services/gateway/internal/auth"
)

// keyOf makes a key of role in ns and the stored form its lookup returns.
func keyOf(t *testing.T, ns string, role auth.Role) (string, auth.StoredKey) {
	t.Helper()
	k, err := keyformat.Generate()
	require.NoError(t, err)
	return k.String(), auth.StoredKey{ID: k.ID, Namespace: ns, Role: role, SecretHash: keyformat.Hash(k.Secret)}
}

// serveStreams serves a Server with no dispatcher behind the auth guard on
// 127.0.0.1:0: every refusal tested here must come before any dispatcher
// call (one would panic on the nil dispatcher).
func serveStreams(t *testing.T, keys ...auth.StoredKey) flov1.WorkerServiceClient {
	t.Helper()
	c, _ := serveStreamsWith(t, nil, nil, keys...)
	return c
}

// serveStreamsWith serves a Server with d and claimer like serveStreams,
// and returns it too.
func serveStreamsWith(t *testing.T, d Dispatcher, claimer Claimer, keys ...auth.StoredKey) (flov1.WorkerServiceClient, *Server) {
	t.Helper()
	byID := map[string]auth.StoredKey{}
	for _, k := range keys {
		byID[k.ID] = k
	}
	guard, err := auth.New(auth.Options{AdminToken: "admin-token", Log: slog.New(slog.DiscardHandler),
		Lookup: func(_ context.Context, id string) (auth.StoredKey, error) {
			k, ok := byID[id]
			if !ok {
				return auth.StoredKey{}, auth.ErrKeyNotFound
			}
			return k, nil
		}})
	require.NoError(t, err)
	srv := NewServer(d, Options{
		MaxPayloadBytes: 1 << 20, DrainTimeout: time.Second, Log: slog.New(slog.DiscardHandler),
		CheckNamespace: func(context.Context, string) error { return nil }, Claimer: claimer,
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer(grpc.StreamInterceptor(guard.StreamInterceptor()))
	flov1.RegisterWorkerServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return flov1.NewWorkerServiceClient(conn), srv
}

// open opens a stream with key and sends hello; it returns the stream and
// the error of its first answer.
func open(t *testing.T, c flov1.WorkerServiceClient, key string, hello *flov1.Hello) (flov1.WorkerService_StreamClient, error) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+key)
	stream, err := c.Stream(ctx)
	require.NoError(t, err)
	// A stream the guard refuses ends before the Hello: Send sees EOF and
	// Recv the status.
	if err := stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: hello}}); !errors.Is(err, io.EOF) {
		require.NoError(t, err)
	}
	msg, err := stream.Recv()
	if err == nil {
		require.NotNil(t, msg.GetHelloAck())
	}
	return stream, err
}

func TestHelloNamespaceAndTokenMustMatchTheKey(t *testing.T) {
	t.Parallel()
	workerA, storedWorkerA := keyOf(t, "a", auth.RoleWorker)
	clientA, storedClientA := keyOf(t, "a", auth.RoleClient)
	c := serveStreams(t, storedWorkerA, storedClientA)

	tests := []struct {
		name  string
		key   string
		hello *flov1.Hello
		want  codes.Code
	}{
		{name: "worker key in its namespace", key: workerA, hello: &flov1.Hello{Namespace: "a"}, want: codes.OK},
		{name: "Hello token equal to the key", key: workerA, hello: &flov1.Hello{Namespace: "a", Token: workerA}, want: codes.OK},
		{name: "admin token in any namespace", key: "admin-token", hello: &flov1.Hello{Namespace: "b"}, want: codes.OK},
		{name: "worker key in another namespace", key: workerA, hello: &flov1.Hello{Namespace: "b"}, want: codes.PermissionDenied},
		{name: "client key", key: clientA, hello: &flov1.Hello{Namespace: "a"}, want: codes.PermissionDenied},
		{name: "Hello token of another key", key: workerA, hello: &flov1.Hello{Namespace: "a", Token: clientA}, want: codes.Unauthenticated},
		{name: "unknown key", key: "flo_nope", hello: &flov1.Hello{Namespace: "a"}, want: codes.Unauthenticated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := open(t, c, tc.key, tc.hello)
			require.Equal(t, tc.want, status.Code(err), "%v", err)
		})
	}
}

func TestReportsOfUnheldTasksAreRefusedWithoutADispatcherCall(t *testing.T) {
	t.Parallel()
	key, stored := keyOf(t, "a", auth.RoleWorker)
	stream, err := open(t, serveStreams(t, stored), key, &flov1.Hello{Namespace: "a", WorkerId: "w1"})
	require.NoError(t, err)

	send := func(m *flov1.WorkerMessage) {
		require.NoError(t, stream.Send(m))
	}
	send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: &flov1.Result{TaskId: "t-other", Attempt: 1,
		Outcome: &flov1.Result_Completed{Completed: &flov1.Completed{Body: []byte(`1`)}}}}})
	ack, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, []string{"t-other"}, ack.GetResultAck().GetRejectedTaskIds())
	require.Contains(t, ack.GetResultAck().GetError(), "does not hold the task")

	send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Nack{Nack: &flov1.Nack{TaskId: "t-nack", Attempt: 1}}})
	ack, err = stream.Recv()
	require.NoError(t, err)
	require.Equal(t, []string{"t-nack"}, ack.GetResultAck().GetRejectedTaskIds())

	send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Abandon{Abandon: &flov1.Abandon{TaskId: "t-abandon", Attempt: 1}}})
	ack, err = stream.Recv()
	require.NoError(t, err)
	require.Equal(t, []string{"t-abandon"}, ack.GetResultAck().GetRejectedTaskIds())

	send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Touch{Touch: &flov1.Touch{TaskId: "t-touch", Attempt: 1, ExtendMs: 1000}}})
	ack, err = stream.Recv()
	require.NoError(t, err)
	require.Equal(t, "t-touch", ack.GetTouchAck().GetTaskId())
	require.False(t, ack.GetTouchAck().GetOk())
	require.Contains(t, ack.GetTouchAck().GetError(), "does not hold the task")

	require.NoError(t, stream.CloseSend())
	_, err = stream.Recv()
	require.ErrorIs(t, err, io.EOF, "the session went on serving after the refusals and ended cleanly")
}

// sessionOf is a session as ownership sees it: its worker, key and sets.
func sessionOf(srv *Server, workerID, keyID string) *session {
	return &session{srv: srv, namespace: "a", workerID: workerID, keyID: keyID, held: newHeld(10), records: newHeldRecords()}
}

func TestAStreamAdoptsOnlyWhatItsOwnWorkerAndKeyHeld(t *testing.T) {
	t.Parallel()
	srv := NewServer(nil, Options{})
	now := time.Now()
	lease := timestamppb.New(now.Add(time.Minute))

	old := sessionOf(srv, "w1", "k1")
	srv.track(old)
	old.held.add([]*flov1.TaskAssignment{{TaskId: "t1", Attempt: 1, LeaseUntil: lease}, {TaskId: "t2", Attempt: 1, LeaseUntil: lease}, {TaskId: "t3", Attempt: 1, LeaseUntil: lease}}, now)
	old.records.add(&delivery{stream: "s", group: "g", ids: []string{"1-0"}, timeout: time.Minute}, now)

	otherWorker := sessionOf(srv, "w2", "k1")
	srv.track(otherWorker)
	otherKey := sessionOf(srv, "w1", "k2")
	srv.track(otherKey)
	require.False(t, otherWorker.ownsTask("t1", 1), "another worker in the namespace cannot report w1's task")
	require.False(t, otherKey.ownsTask("t1", 1), "a stream of the same worker id with another key cannot either")
	require.False(t, otherWorker.ownsRecord("s", "g", "1-0"))

	// The worker reconnects while its old stream is still open.
	next := sessionOf(srv, "w1", "k1")
	srv.track(next)
	require.True(t, next.ownsTask("t1", 1))
	require.False(t, old.held.has(attemptKey("t1", 1)), "the task moved to the new stream")
	require.True(t, old.ownsTask("t1", 1), "and back, were the old stream to report it")
	require.True(t, next.ownsTask("t1", 1))

	// The old stream ends; what it held waits for the worker's next stream.
	srv.retire(old)
	require.True(t, next.ownsTask("t2", 1))
	require.True(t, next.ownsRecord("s", "g", "1-0"))
	require.False(t, otherWorker.ownsTask("t3", 1))
	require.False(t, next.ownsTask("t-never-sent", 1))
	require.Equal(t, 2, next.held.len())
}

// A task nacked or failed for a retry can come back to the same stream as its next attempt
// before the report of the last one returns; forgetting that report keeps the new attempt,
// and a stale attempt is not the stream's to report.
func TestAReportForgetsItsAttemptNotTheTasksNextOne(t *testing.T) {
	t.Parallel()
	srv := NewServer(nil, Options{})
	s := sessionOf(srv, "w1", "k1")
	srv.track(s)
	now := time.Now()
	lease := timestamppb.New(now.Add(time.Minute))
	s.held.add([]*flov1.TaskAssignment{{TaskId: "t1", Attempt: 1, LeaseUntil: lease}}, now)
	s.held.add([]*flov1.TaskAssignment{{TaskId: "t1", Attempt: 2, LeaseUntil: lease}}, now)
	s.held.remove([]string{attemptKey("t1", 1)})
	require.True(t, s.ownsTask("t1", 2), "the next attempt is still held")
	require.False(t, s.ownsTask("t1", 1), "the reported attempt is not")
	require.False(t, s.ownsTask("t1", 3), "nor one never sent")
}

func TestLeftoversExpireAndAreBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := newLeftovers()
	l.keep("o", map[string]time.Time{"t1": now, "t2": now.Add(time.Hour)}, map[string]time.Time{"s/g/1-0": now}, now)

	_, ok := l.take(&l.tasks, "o", "t1", now.Add(leaseGrace+time.Second))
	require.False(t, ok, "a task whose lease ended more than leaseGrace ago has been requeued")
	_, ok = l.take(&l.records, "o", "s/g/1-0", now.Add(time.Second))
	require.False(t, ok, "a record past its time")
	until, ok := l.take(&l.tasks, "o", "t2", now)
	require.True(t, ok)
	require.Equal(t, now.Add(time.Hour), until)
	_, ok = l.take(&l.tasks, "o", "t2", now)
	require.False(t, ok, "taken once")
	require.Zero(t, l.n)

	many := make(map[string]time.Time, maxHandover+10)
	for i := range maxHandover + 10 {
		many[strconv.Itoa(i)] = now.Add(time.Hour)
	}
	l.keep("o", many, nil, now)
	require.Equal(t, maxHandover, l.n)
	l.keep("o", map[string]time.Time{"x": now.Add(2 * time.Hour)}, nil, now.Add(3*time.Hour))
	require.Equal(t, 1, l.n, "expired leftovers are swept when more are kept")
}

// redeliveringStreams plays a streams service whose Nack hands the records straight back to
// the same stream, as a nack without delay may, before the Nack call has returned.
type redeliveringStreams struct {
	Streams
	to *session
}

func (r redeliveringStreams) Nack(_ context.Context, in *flov1.NackRequest, _ ...grpc.CallOption) (*flov1.NackResponse, error) {
	r.to.records.add(&delivery{stream: in.GetStream(), group: in.GetGroup(), ids: in.GetIds(), timeout: time.Minute}, time.Now())
	return &flov1.NackResponse{}, nil
}

// A record nacked and sent again to the same stream before the nack returned stays the
// stream's to settle.
func TestANackForgetsItsDeliveryNotTheRecordsNextOne(t *testing.T) {
	t.Parallel()
	s := sessionOf(NewServer(nil, Options{}), "w1", "k1")
	s.srv.opts.Streams = redeliveringStreams{to: s}
	s.calls, s.log = context.Background(), slog.New(slog.DiscardHandler)
	s.records.add(&delivery{stream: "s", group: "g", ids: []string{"1-0"}, timeout: time.Minute}, time.Now())

	s.settleCall(settleKey{stream: "s", group: "g", nack: true}, []string{"1-0"})
	require.True(t, s.ownsRecord("s", "g", "1-0"), "the second delivery can be acked")
}
