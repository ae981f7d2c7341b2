package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
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
	return runCLIWithInput(t, "", args...)
}

// runCLIWithInput runs the command line with stdin as its standard input.
func runCLIWithInput(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
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
		{name: "task complete without token", args: []string{"task", "complete"}, wantErr: "accepts between 1 and 2 arg(s), received 0"},
		{name: "task complete with invalid JSON", args: []string{"task", "complete", "flo1.x", "{ok}"}, wantErr: "invalid JSON payload"},
		{name: "task fail without error", args: []string{"task", "fail", "flo1.x"}, wantErr: "--error is required"},
		{name: "dlq negative limit", args: []string{"task", "dlq", "list", "--limit", "-5"}, wantErr: "--limit must not be negative"},
		{name: "dlq requeue without id", args: []string{"task", "dlq", "requeue"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "namespace create without name", args: []string{"namespace", "create"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "worker list with argument", args: []string{"worker", "list", "w-1"}, wantErr: `unknown command "w-1"`},
		{name: "worker get without id", args: []string{"worker", "get"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "worker get with two ids", args: []string{"worker", "get", "w-1", "w-2"}, wantErr: "accepts 1 arg(s), received 2"},
		{name: "worker drain without id", args: []string{"worker", "drain"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "worker deregister without id", args: []string{"worker", "deregister"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "unknown command", args: []string{"actoin", "list"}, wantErr: `unknown command "actoin"`},
		{name: "unknown action subcommand", args: []string{"action", "lsit"}, wantErr: `unknown command "lsit" for "flo action"; did you mean "list"?`},
		{name: "unknown task subcommand", args: []string{"task", "nope"}, wantErr: `unknown command "nope" for "flo task"`},
		{name: "unknown dlq subcommand", args: []string{"task", "dlq", "purge"}, wantErr: `unknown command "purge" for "flo task dlq"`},
		{name: "unknown worker subcommand", args: []string{"worker", "drian", "w-1"}, wantErr: `unknown command "drian" for "flo worker"; did you mean "drain"?`},
		{name: "unknown namespace subcommand", args: []string{"namespace", "delete"}, wantErr: `unknown command "delete" for "flo namespace"`},
		{name: "unknown stream subcommand", args: []string{"stream", "tail", "events"}, wantErr: `unknown command "tail" for "flo stream"`},
		{name: "unknown stream group subcommand", args: []string{"stream", "group", "reset"}, wantErr: `unknown command "reset" for "flo stream group"`},
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

// recordingWorkers answers the worker-registry calls the CLI makes and keeps the requests.
type recordingWorkers struct {
	flov1.UnimplementedWorkerRegistryServiceServer
	mu       sync.Mutex
	requests []string
}

func (r *recordingWorkers) note(call, namespace, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, call+" "+namespace+"/"+id)
}

func sampleWorker(namespace, id string, st flov1.WorkerStatus) *flov1.Worker {
	return &flov1.Worker{
		Namespace: namespace, WorkerId: id, WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION, Status: st,
		MaxConcurrency: 10, CurrentLoad: 3, MachineId: "laptop", Metadata: `{"v":1}`, TasksCompleted: 4,
		Processes: []*flov1.WorkerProcess{{Name: "process-order", Kind: flov1.ProcessKind_PROCESS_KIND_ACTION, RunCount: 4}},
	}
}

func (r *recordingWorkers) ListWorkers(_ context.Context, req *flov1.ListWorkersRequest) (*flov1.ListWorkersResponse, error) {
	r.note("list", req.GetNamespace(), "")
	return &flov1.ListWorkersResponse{Workers: []*flov1.Worker{
		sampleWorker(req.GetNamespace(), "w-1", flov1.WorkerStatus_WORKER_STATUS_ACTIVE),
		sampleWorker(req.GetNamespace(), "w-2", flov1.WorkerStatus_WORKER_STATUS_UNHEALTHY),
	}}, nil
}

func (r *recordingWorkers) GetWorker(_ context.Context, req *flov1.GetWorkerRequest) (*flov1.Worker, error) {
	r.note("get", req.GetNamespace(), req.GetWorkerId())
	if req.GetWorkerId() != "w-1" {
		return nil, status.Errorf(codes.NotFound, "worker %s not found", req.GetWorkerId())
	}
	return sampleWorker(req.GetNamespace(), "w-1", flov1.WorkerStatus_WORKER_STATUS_IDLE), nil
}

func (r *recordingWorkers) DrainWorker(_ context.Context, req *flov1.GetWorkerRequest) (*flov1.Worker, error) {
	r.note("drain", req.GetNamespace(), req.GetWorkerId())
	return sampleWorker(req.GetNamespace(), req.GetWorkerId(), flov1.WorkerStatus_WORKER_STATUS_DRAINING), nil
}

func (r *recordingWorkers) DeregisterWorker(_ context.Context, req *flov1.GetWorkerRequest) (*flov1.DeregisterWorkerResponse, error) {
	r.note("deregister", req.GetNamespace(), req.GetWorkerId())
	return &flov1.DeregisterWorkerResponse{}, nil
}

func TestWorkerCommands(t *testing.T) {
	r := &recordingWorkers{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	flov1.RegisterWorkerRegistryServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	addr := lis.Addr().String()

	code, stdout, stderr := runCLI(t, "--addr", addr, "-n", "myapp", "worker", "list")
	require.Equal(t, 0, code, stderr)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	require.Len(t, list, 2)
	require.Equal(t, "w-1", list[0]["worker_id"])
	require.Equal(t, "action", list[0]["worker_type"])
	require.Equal(t, "active", list[0]["status"])
	require.Equal(t, "unhealthy", list[1]["status"])
	require.InDelta(t, 10, list[0]["max_concurrency"], 0)
	require.InDelta(t, 3, list[0]["current_load"], 0)
	require.Equal(t, map[string]any{"v": float64(1)}, list[0]["metadata"])
	require.Equal(t, "process-order", list[0]["processes"].([]any)[0].(map[string]any)["name"])

	code, stdout, stderr = runCLI(t, "--addr", addr, "-n", "myapp", "worker", "get", "w-1")
	require.Equal(t, 0, code, stderr)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
	require.Equal(t, "idle", got["status"])

	code, stdout, stderr = runCLI(t, "--addr", addr, "-n", "myapp", "worker", "drain", "w-1")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
	require.Equal(t, "draining", got["status"])

	code, stdout, stderr = runCLI(t, "--addr", addr, "-n", "myapp", "worker", "deregister", "w-1")
	require.Equal(t, 0, code, stderr)
	require.JSONEq(t, `{"worker_id":"w-1","status":"deregistered"}`, stdout)

	code, stdout, stderr = runCLI(t, "--addr", addr, "-n", "myapp", "worker", "get", "ghost")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "flo: get worker ghost:")
	require.Contains(t, stderr, "NotFound")

	require.Equal(t, []string{"list myapp/", "get myapp/w-1", "drain myapp/w-1", "deregister myapp/w-1", "get myapp/ghost"}, r.requests)
}

func TestEmptyListsPrintAsEmptyArrays(t *testing.T) {
	var out bytes.Buffer
	cmd := newRootCmd()
	cmd.SetOut(&out)
	var none []string
	require.NoError(t, printJSON(cmd, none))
	require.Equal(t, "[]\n", out.String())
}
