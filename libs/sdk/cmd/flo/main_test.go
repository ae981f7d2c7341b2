package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// unreachable is an address nothing listens on: commands that fail validation must fail before
// they need a server.
const unreachable = "127.0.0.1:1"

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestArgumentValidation(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "invalid JSON payload", args: []string{"action", "invoke", "process-order", "{order: 1}"}, wantErr: "invalid JSON payload: invalid character 'o'"},
		{name: "truncated JSON payload", args: []string{"action", "invoke", "process-order", `{"a":`}, wantErr: "invalid JSON payload: unexpected end of JSON input"},
		{name: "invoke without action", args: []string{"action", "invoke"}, wantErr: "accepts between 1 and 2 arg(s), received 0"},
		{name: "invoke with extra argument", args: []string{"action", "invoke", "a", "{}", "extra"}, wantErr: "accepts between 1 and 2 arg(s), received 3"},
		{name: "negative delay", args: []string{"action", "invoke", "a", "--delay", "-1s"}, wantErr: "--delay must not be negative"},
		{name: "wait without time", args: []string{"action", "invoke", "a", "--wait", "--timeout", "0s"}, wantErr: "--timeout must be positive"},
		{name: "bad duration", args: []string{"action", "invoke", "a", "--delay", "soon"}, wantErr: `invalid argument "soon" for "--delay"`},
		{name: "unknown backoff", args: []string{"action", "register", "a", "--backoff", "fibonacci"}, wantErr: `unknown backoff kind "fibonacci"`},
		{name: "negative attempts", args: []string{"action", "register", "a", "--max-attempts", "-1"}, wantErr: "must not be negative"},
		{name: "register without name", args: []string{"action", "register"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "get without name", args: []string{"action", "get"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "list with argument", args: []string{"action", "list", "x"}, wantErr: `unknown command "x"`},
		{name: "task await without id", args: []string{"task", "await"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "task await with zero timeout", args: []string{"task", "await", "t-1", "--timeout", "0s"}, wantErr: "--timeout must be positive"},
		{name: "dlq negative limit", args: []string{"task", "dlq", "list", "--limit", "-5"}, wantErr: "--limit must not be negative"},
		{name: "dlq requeue without id", args: []string{"task", "dlq", "requeue"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "namespace create without name", args: []string{"namespace", "create"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "unknown command", args: []string{"actoin", "list"}, wantErr: `unknown command "actoin"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append(tt.args, "--addr", unreachable)...)
			require.Equal(t, 1, code)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tt.wantErr)
			require.Regexp(t, `^flo: `, stderr)
		})
	}
}

func TestGlobalFlagDefaultsComeFromTheEnvironment(t *testing.T) {
	t.Setenv("FLO_NAMESPACE", "")
	t.Setenv("FLO_ADDR", "")
	root := newRootCmd()
	require.Equal(t, "default", root.PersistentFlags().Lookup("namespace").DefValue)
	require.Equal(t, "localhost:9000", root.PersistentFlags().Lookup("addr").DefValue)

	t.Setenv("FLO_NAMESPACE", "myapp")
	t.Setenv("FLO_ADDR", "gateway:9000")
	root = newRootCmd()
	require.Equal(t, "myapp", root.PersistentFlags().Lookup("namespace").DefValue)
	require.Equal(t, "gateway:9000", root.PersistentFlags().Lookup("addr").DefValue)
}

// recordingTasks answers the task calls the CLI makes and keeps the requests, so the test can
// check what the flags turned into on the wire.
type recordingTasks struct {
	flov1.UnimplementedTaskServiceServer
	flov1.UnimplementedActionServiceServer
	mu      sync.Mutex
	invokes []*flov1.InvokeTaskRequest
	awaits  []*flov1.AwaitTaskRequest
}

func (r *recordingTasks) InvokeTask(_ context.Context, req *flov1.InvokeTaskRequest) (*flov1.InvokeTaskResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.invokes = append(r.invokes, req)
	return &flov1.InvokeTaskResponse{TaskId: "t-1"}, nil
}

func (r *recordingTasks) AwaitTask(_ context.Context, req *flov1.AwaitTaskRequest) (*flov1.Task, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.awaits = append(r.awaits, req)
	return &flov1.Task{
		Id: req.GetTaskId(), Namespace: req.GetNamespace(), Action: "process-order",
		Status: flov1.TaskStatus_TASK_STATUS_COMPLETED, Attempt: 2, MaxAttempts: 3,
		Result: []byte(`{"status":"done"}`), Outcome: "approved",
	}, nil
}

func (r *recordingTasks) GetAction(_ context.Context, req *flov1.GetActionRequest) (*flov1.Action, error) {
	return nil, status.Errorf(codes.NotFound, "action %s not found in namespace %s", req.GetName(), req.GetNamespace())
}

func serve(t *testing.T, r *recordingTasks) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	flov1.RegisterTaskServiceServer(srv, r)
	flov1.RegisterActionServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func TestInvokeSendsFlagsAndPrintsJSON(t *testing.T) {
	r := &recordingTasks{}
	addr := serve(t, r)

	code, stdout, stderr := runCLI(t, "--addr", addr, "--namespace", "myapp", "action", "invoke", "process-order",
		`{"order_id": "o-1"}`, "--idempotency-key", "k-1", "--priority", "7", "--delay", "1500ms")
	require.Equal(t, 0, code, stderr)
	require.JSONEq(t, `{"task_id":"t-1"}`, stdout)
	require.Len(t, r.invokes, 1)
	req := r.invokes[0]
	require.Equal(t, "myapp", req.GetNamespace())
	require.Equal(t, "process-order", req.GetAction())
	require.JSONEq(t, `{"order_id":"o-1"}`, string(req.GetPayload()))
	require.Equal(t, "k-1", req.GetIdempotencyKey())
	require.Equal(t, int32(7), req.GetPriority())
	require.Equal(t, int64(1500), req.GetDelayMs())

	code, stdout, stderr = runCLI(t, "--addr", addr, "-n", "myapp", "action", "invoke", "process-order", "--wait", "--timeout", "10s")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, r.invokes[1].GetPayload())
	require.Equal(t, int64(10_000), r.awaits[0].GetTimeoutMs())
	var task map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &task))
	require.Equal(t, "completed", task["status"])
	require.InDelta(t, 2, task["attempt"], 0)
	require.Equal(t, map[string]any{"status": "done"}, task["result"])
	require.Equal(t, "approved", task["outcome"])
}

func TestServerErrorsGoToStderr(t *testing.T) {
	t.Setenv("FLO_NAMESPACE", "")
	addr := serve(t, &recordingTasks{})
	code, stdout, stderr := runCLI(t, "--addr", addr, "action", "get", "nope")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "flo: get action nope:")
	require.Contains(t, stderr, "NotFound")
	require.Contains(t, stderr, "action nope not found in namespace default")
}
