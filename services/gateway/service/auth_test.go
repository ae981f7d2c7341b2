package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/razorbill/flo/libs/harness"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"

	"github.com/razorbill/flo/services/gateway/internal/auth"
	"github.com/razorbill/flo/services/gateway/service"
)

// nsRoles are the roles a key of one namespace may have.
var nsRoles = []auth.Role{auth.RoleClient, auth.RoleWorker, auth.RoleRead}

// authKeys are the keys the auth tests call with: one per role in
// namespaces "a" and "b", and a revoked client key of "a".
type authKeys struct {
	admin   string
	of      map[string]map[auth.Role]string
	revoked string
}

// authConn is a connection without the stack's own credentials, so each
// call carries exactly the key a test gives it.
func authConn(t *testing.T, s *stack) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(s.gateway.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// as sends key as the call's bearer token; an empty key sends none.
func as(key string) grpc.CallOption { return grpc.PerRPCCredentials(harness.Bearer(key)) }

// makeKeys creates namespaces a and b and the keys of authKeys with the
// admin token.
func makeKeys(t *testing.T, s *stack) authKeys {
	t.Helper()
	keys := authKeys{admin: adminToken, of: map[string]map[auth.Role]string{}}
	for _, ns := range []string{"a", "b"} {
		_, err := s.namespaces.CreateNamespace(testContext(t), &flov1.CreateNamespaceRequest{Name: ns})
		require.NoError(t, err)
		keys.of[ns] = map[auth.Role]string{}
		for _, role := range nsRoles {
			keys.of[ns][role] = createKey(t, s, ns, role).GetSecret()
		}
	}
	revoked := createKey(t, s, "a", auth.RoleClient)
	_, err := flov1.NewKeyServiceClient(s.conn).RevokeKey(testContext(t), &flov1.RevokeKeyRequest{Id: revoked.GetKey().GetId()})
	require.NoError(t, err)
	keys.revoked = revoked.GetSecret()
	return keys
}

// createKey makes a key of role in ns with the admin token.
func createKey(t *testing.T, s *stack, ns string, role auth.Role) *flov1.CreateKeyResponse {
	t.Helper()
	resp, err := flov1.NewKeyServiceClient(s.conn).CreateKey(testContext(t), &flov1.CreateKeyRequest{Namespace: ns, Role: string(role)})
	require.NoError(t, err)
	return resp
}

// authCase is one call of the table: a key, the namespace the call names,
// and whether the gateway must let it through.
type authCase struct {
	name   string
	key    string
	ns     string
	refuse codes.Code // codes.OK: accepted, whatever the handler answers
}

// authCases are the calls every public method and route is tried with.
func authCases(rule auth.Rule, keys authKeys) []authCase {
	cases := []authCase{
		{name: "missing key", ns: "a", refuse: codes.Unauthenticated},
		{name: "revoked key", key: keys.revoked, ns: "a", refuse: codes.Unauthenticated},
		{name: "admin token", key: keys.admin, ns: "a"},
	}
	for _, role := range nsRoles {
		allowed := rule.AnyKey || slices.Contains(rule.Roles, role)
		switch {
		case !allowed:
			cases = append(cases, authCase{name: "role " + string(role), key: keys.of["a"][role], ns: "a", refuse: codes.PermissionDenied})
		case rule.AnyKey:
			cases = append(cases, authCase{name: "any key, " + string(role), key: keys.of["a"][role], ns: "a"})
		default:
			cases = append(cases,
				authCase{name: "role " + string(role), key: keys.of["a"][role], ns: "a"},
				authCase{name: "role " + string(role) + " of another namespace", key: keys.of["b"][role], ns: "a", refuse: codes.PermissionDenied})
		}
	}
	return cases
}

// publicMethods are the methods of every flo.v1 service, from the
// registered descriptors: a method added to the protos shows up here.
func publicMethods(t *testing.T) []protoreflect.MethodDescriptor {
	t.Helper()
	var methods []protoreflect.MethodDescriptor
	protoregistry.GlobalFiles.RangeFilesByPackage("flo.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				methods = append(methods, svc.Methods().Get(j))
			}
		}
		return true
	})
	require.NotEmpty(t, methods)
	return methods
}

func fullMethod(m protoreflect.MethodDescriptor) string {
	return "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
}

// callMethod makes one call of m naming namespace ns and returns its code.
// Requests are otherwise empty: the answer only has to show whether the
// gateway let the call through.
func callMethod(t *testing.T, conn *grpc.ClientConn, m protoreflect.MethodDescriptor, rule auth.Rule, key, ns string) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if m.IsStreamingClient() || m.IsStreamingServer() {
		require.Equal(t, flov1.WorkerService_Stream_FullMethodName, fullMethod(m), "a new streaming method: teach this test how to open it")
		stream, err := flov1.NewWorkerServiceClient(conn).Stream(ctx, as(key))
		require.NoError(t, err)
		// A stream refused at once ends before the Hello: Send sees EOF and
		// Recv the status.
		if err := stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{Namespace: ns}}}); !errors.Is(err, io.EOF) {
			require.NoError(t, err)
		}
		_, err = stream.Recv()
		return status.Code(err)
	}
	req := newMessage(t, m.Input().FullName())
	if rule.NamespaceField != "" {
		fd := m.Input().Fields().ByName(protoreflect.Name(rule.NamespaceField))
		req.ProtoReflect().Set(fd, protoreflect.ValueOfString(ns))
	}
	err := conn.Invoke(ctx, fullMethod(m), req, newMessage(t, m.Output().FullName()), as(key))
	return status.Code(err)
}

func newMessage(t *testing.T, name protoreflect.FullName) proto.Message {
	t.Helper()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
	require.NoError(t, err)
	return mt.New().Interface()
}

func TestEveryPublicMethodChecksKeyRoleAndNamespace(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	conn := authConn(t, s)
	keys := makeKeys(t, s)
	rules := auth.Rules()

	for _, m := range publicMethods(t) {
		name := fullMethod(m)
		rule, ok := rules[name]
		if !ok {
			t.Errorf("%s has no rule in auth.rules: give every public method one", name)
			continue
		}
		for _, tc := range authCases(rule, keys) {
			code := callMethod(t, conn, m, rule, tc.key, tc.ns)
			if tc.refuse != codes.OK {
				require.Equal(t, tc.refuse, code, "%s, %s", name, tc.name)
				continue
			}
			require.NotContains(t, []codes.Code{codes.Unauthenticated, codes.PermissionDenied}, code, "%s, %s: refused", name, tc.name)
		}
	}
}

func TestEveryRESTRouteChecksKeyRoleAndNamespace(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	keys := makeKeys(t, s)
	rules := auth.Rules()

	doc := restAs(t, s, http.MethodGet, "/openapi.json", keys.admin, "")
	require.Equal(t, http.StatusOK, doc.status)
	var openapi struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(doc.raw, &openapi))
	require.NotEmpty(t, openapi.Paths)
	require.Equal(t, http.StatusUnauthorized, restAs(t, s, http.MethodGet, "/openapi.json", "", "").status)

	param := regexp.MustCompile(`\{([^}]+)\}`)
	for path, ops := range openapi.Paths {
		for method, op := range ops {
			method = strings.ToUpper(method)
			svc, rpc, _ := strings.Cut(op.OperationID, "_")
			name := "/flo.v1." + svc + "/" + rpc
			rule, ok := rules[name]
			if !ok {
				t.Errorf("%s %s calls %s, which has no rule", method, path, name)
				continue
			}
			body := ""
			if method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch {
				body = "{}"
			}
			for _, tc := range authCases(rule, keys) {
				url := param.ReplaceAllStringFunc(path, func(p string) string {
					if p[1:len(p)-1] == rule.NamespaceField {
						return tc.ns
					}
					return "x"
				})
				got := restAs(t, s, method, url, tc.key, body)
				switch tc.refuse {
				case codes.Unauthenticated:
					require.Equal(t, http.StatusUnauthorized, got.status, "%s %s, %s: %s", method, url, tc.name, got.raw)
				case codes.PermissionDenied:
					require.Equal(t, http.StatusForbidden, got.status, "%s %s, %s: %s", method, url, tc.name, got.raw)
				default:
					require.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusUnsupportedMediaType}, got.status,
						"%s %s, %s: refused: %s", method, url, tc.name, got.raw)
				}
			}
		}
	}
}

// restAs makes a REST call with key as the bearer; a body goes as JSON.
func restAs(t *testing.T, s *stack, method, path, key, body string) restResponse {
	t.Helper()
	req, err := http.NewRequestWithContext(testContext(t), method, s.base+path, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	out := restResponse{status: resp.StatusCode}
	out.raw, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	return out
}

// asKey returns s seen through a connection that carries key instead of
// the admin token.
func asKey(t *testing.T, s *stack, key string) *stack {
	t.Helper()
	conn, err := grpc.NewClient(s.gateway.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(harness.Bearer(key)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c := *s
	c.conn = conn
	c.namespaces = flov1.NewNamespaceServiceClient(conn)
	c.tasks = flov1.NewTaskServiceClient(conn)
	c.workers = flov1.NewWorkerServiceClient(conn)
	return &c
}

// invokeIn invokes action in ns and returns the task id.
func invokeIn(t *testing.T, s *stack, ns, action string) string {
	t.Helper()
	resp, err := s.tasks.InvokeTask(testContext(t), &flov1.InvokeTaskRequest{Namespace: ns, Action: action, Payload: []byte(`1`)})
	require.NoError(t, err)
	return resp.GetTaskId()
}

// refusedReport sends m and requires the ResultAck that refuses it as a
// report of a task the stream does not hold.
func refusedReport(t *testing.T, w *rawWorker, id string, m *flov1.WorkerMessage) {
	t.Helper()
	w.send(t, m)
	ack := w.next(t).GetResultAck()
	require.NotNil(t, ack)
	require.Equal(t, []string{id}, ack.GetRejectedTaskIds())
	require.Contains(t, ack.GetError(), "does not hold the task")
}

// refusedTouch touches task id and requires the refusal.
func refusedTouch(t *testing.T, w *rawWorker, id string, attempt int32) {
	t.Helper()
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Touch{Touch: &flov1.Touch{TaskId: id, Attempt: attempt, ExtendMs: 60_000}}})
	ack := w.next(t).GetTouchAck()
	require.NotNil(t, ack)
	require.Equal(t, id, ack.GetTaskId())
	require.False(t, ack.GetOk())
	require.Contains(t, ack.GetError(), "does not hold the task")
}

func TestWorkersActOnlyOnTheirOwnTasks(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	keys := makeKeys(t, s)
	other := createKey(t, s, "a", auth.RoleWorker)
	clientA, clientB := asKey(t, s, keys.of["a"][auth.RoleClient]), asKey(t, s, keys.of["b"][auth.RoleClient])
	workerA, workerA2, workerB := asKey(t, s, keys.of["a"][auth.RoleWorker]), asKey(t, s, other.GetSecret()), asKey(t, s, keys.of["b"][auth.RoleWorker])

	// A worker key of a cannot open a stream in b, so it cannot claim b's tasks.
	stream, err := workerA.workers.Stream(testContext(t))
	require.NoError(t, err)
	require.NoError(t, stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{Namespace: "b", Actions: []string{"job"}}}}))
	_, err = stream.Recv()
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)

	b := openWorker(t, workerB, &flov1.Hello{Namespace: "b", WorkerId: "b1", Actions: []string{"job"}})
	b.ready(t, 1, 30_000, "job")
	idB := invokeIn(t, clientB, "b", "job")
	taskB := b.tasks(t, 1)[0]
	require.Equal(t, idB, taskB.GetTaskId())

	// Nor report or touch them from its own namespace.
	a1 := openWorker(t, workerA, &flov1.Hello{Namespace: "a", WorkerId: "a1", Actions: []string{"job"}})
	refusedReport(t, a1, idB, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(idB, taskB.GetAttempt(), `"stolen"`)}})
	refusedTouch(t, a1, idB, taskB.GetAttempt())

	// Another worker of a cannot act on a task a1 holds.
	a1.ready(t, 1, 30_000, "job")
	idA := invokeIn(t, clientA, "a", "job")
	taskA := a1.tasks(t, 1)[0]
	require.Equal(t, idA, taskA.GetTaskId())
	a2 := openWorker(t, workerA2, &flov1.Hello{Namespace: "a", WorkerId: "a2", Actions: []string{"job"}})
	refusedReport(t, a2, idA, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(idA, taskA.GetAttempt(), `"stolen"`)}})
	refusedReport(t, a2, idA, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Nack{Nack: &flov1.Nack{TaskId: idA, Attempt: taskA.GetAttempt()}}})
	refusedReport(t, a2, idA, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Abandon{Abandon: &flov1.Abandon{TaskId: idA, Attempt: taskA.GetAttempt()}}})
	refusedTouch(t, a2, idA, taskA.GetAttempt())

	// The holders' own reports are taken.
	a1.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(idA, taskA.GetAttempt(), `"a1"`)}})
	b.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(idB, taskB.GetAttempt(), `"b1"`)}})
	for _, c := range []struct {
		s      *stack
		ns, id string
		want   string
	}{{clientA, "a", idA, `"a1"`}, {clientB, "b", idB, `"b1"`}} {
		task, err := c.s.tasks.AwaitTask(testContext(t), &flov1.AwaitTaskRequest{Namespace: c.ns, TaskId: c.id, TimeoutMs: 30_000})
		require.NoError(t, err)
		require.Equal(t, flov1.TaskStatus_TASK_STATUS_COMPLETED, task.GetStatus())
		require.JSONEq(t, c.want, string(task.GetResult()))
	}
}

func TestListNamespacesShowsAKeyItsOwn(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	keys := makeKeys(t, s)
	names := func(s *stack) []string {
		resp, err := s.namespaces.ListNamespaces(testContext(t), &flov1.ListNamespacesRequest{})
		require.NoError(t, err)
		var out []string
		for _, ns := range resp.GetNamespaces() {
			out = append(out, ns.GetName())
		}
		return out
	}
	require.Equal(t, []string{"a"}, names(asKey(t, s, keys.of["a"][auth.RoleRead])))
	require.Equal(t, []string{"b"}, names(asKey(t, s, keys.of["b"][auth.RoleWorker])))
	require.Subset(t, names(s), []string{"a", "b", "default"}, "the admin sees every namespace")
}

// startLimitedGateway starts another gateway on s's dispatcher whose keys
// have the rates of keys (the stack's own gateway has none).
func startLimitedGateway(t *testing.T, s *stack, keys auth.Config) *service.Service {
	t.Helper()
	keys.AdminToken = adminToken
	gw, err := service.New(context.Background(), service.Config{
		GRPCAddr:        "127.0.0.1:0",
		HTTPAddr:        "127.0.0.1:0",
		MetricsAddr:     "127.0.0.1:0",
		DispatcherAddr:  s.dispatchAddr,
		RegistryAddr:    s.registryAddr,
		MaxPayloadBytes: testMaxPayload,
		Auth:            harness.InternalAuth(),
		APIKeys:         keys,
		Kafka:           s.kafka(),
	}, s.log.With("service", "gateway-limited"))
	require.NoError(t, err)
	run(t, gw.Run)
	require.Eventually(t, gw.Ready, wait, 10*time.Millisecond, "gateway never became ready")
	return gw
}

func TestRateLimitIsPerKey(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	keys := makeKeys(t, s)
	// One read a hundred seconds, a burst of one: the second call in a row
	// is over the rate however slowly the box runs.
	gw := startLimitedGateway(t, s, auth.Config{RateRead: 0.01})
	conn, err := grpc.NewClient(gw.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	tasks := flov1.NewTaskServiceClient(conn)
	get := func(key, ns string) (codes.Code, metadata.MD) {
		var trailer metadata.MD
		_, err := tasks.GetTask(testContext(t), &flov1.GetTaskRequest{Namespace: ns, TaskId: uuid.NewString()}, grpc.Trailer(&trailer), as(key))
		return status.Code(err), trailer
	}

	limited := keys.of["a"][auth.RoleRead]
	code, _ := get(limited, "a")
	require.Equal(t, codes.NotFound, code)
	code, trailer := get(limited, "a")
	require.Equal(t, codes.ResourceExhausted, code)
	requireRetryAfter(t, trailer.Get("retry-after"))
	code, _ = get(keys.of["b"][auth.RoleRead], "b")
	require.Equal(t, codes.NotFound, code, "another key is served meanwhile")
	code, _ = get(keys.of["a"][auth.RoleClient], "a")
	require.Equal(t, codes.NotFound, code, "and a key of another role, whose rate is unlimited here")

	// REST counts against the same bucket and answers 429 with Retry-After.
	req, err := http.NewRequestWithContext(testContext(t), http.MethodGet, "http://"+gw.HTTPAddr()+"/v1/namespaces/a/tasks/"+uuid.NewString(), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+limited)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	requireRetryAfter(t, resp.Header.Values("Retry-After"))
}

// requireRetryAfter checks a retry-after of the limited gateway's read rate:
// the seconds until the next token, at most 100.
func requireRetryAfter(t *testing.T, values []string) {
	t.Helper()
	require.Len(t, values, 1)
	secs, err := strconv.Atoi(values[0])
	require.NoError(t, err)
	require.True(t, secs > 0 && secs <= 100, "retry-after %d", secs)
}

func TestRevokedKeyIsRefusedOnceTheCacheTTLPasses(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	keys := makeKeys(t, s)
	created := createKey(t, s, "a", auth.RoleRead)
	list := func(as *stack) codes.Code {
		_, err := as.tasks.ListDeadLetters(testContext(t), &flov1.ListDeadLettersRequest{Namespace: "a"})
		return status.Code(err)
	}
	reader := asKey(t, s, created.GetSecret())
	require.Equal(t, codes.OK, list(reader), "the key works, and the gateway caches it")

	revokedAt := time.Now()
	_, err := flov1.NewKeyServiceClient(s.conn).RevokeKey(testContext(t), &flov1.RevokeKeyRequest{Id: created.GetKey().GetId()})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return list(reader) == codes.Unauthenticated }, wait, 50*time.Millisecond)
	// The default cache TTL is 2 s; the margin is for a loaded box.
	require.Less(t, time.Since(revokedAt), 10*time.Second, "a revoke must take effect within the key cache TTL")
	require.Equal(t, codes.OK, list(asKey(t, s, keys.of["a"][auth.RoleRead])), "other keys are untouched")
}
