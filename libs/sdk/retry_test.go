package flo_test

import (
	"context"
	"net"
	"sync"
	"testing"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// flakyTasks plays a gateway's TaskService that answers UNAVAILABLE to the
// first failures calls of each method, as one does while the service behind
// it restarts.
type flakyTasks struct {
	flov1.UnimplementedTaskServiceServer
	failures int

	mu    sync.Mutex
	calls map[string]int
}

func (f *flakyTasks) call(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method]++
	if f.calls[method] <= f.failures {
		return status.Error(codes.Unavailable, "gateway restarting")
	}
	return nil
}

func (f *flakyTasks) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *flakyTasks) GetTask(_ context.Context, req *flov1.GetTaskRequest) (*flov1.Task, error) {
	if err := f.call("GetTask"); err != nil {
		return nil, err
	}
	return &flov1.Task{Id: req.GetTaskId()}, nil
}

func (f *flakyTasks) InvokeTask(context.Context, *flov1.InvokeTaskRequest) (*flov1.InvokeTaskResponse, error) {
	if err := f.call("InvokeTask"); err != nil {
		return nil, err
	}
	return &flov1.InvokeTaskResponse{TaskId: "t-1"}, nil
}

// flakyWorkflows plays the WorkflowService's StartRun the same way.
type flakyWorkflows struct {
	flov1.UnimplementedWorkflowServiceServer
	*flakyTasks
}

func (f flakyWorkflows) StartRun(context.Context, *flov1.StartRunRequest) (*flov1.StartRunResponse, error) {
	if err := f.call("StartRun"); err != nil {
		return nil, err
	}
	return &flov1.StartRunResponse{RunId: "r-1", Created: true}, nil
}

// startFlaky serves a gateway that fails the first failures calls of each
// method, and returns it with a client connected to it.
func startFlaky(t *testing.T, failures int) (*flakyTasks, *flo.Client) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &flakyTasks{failures: failures, calls: map[string]int{}}
	srv := grpc.NewServer()
	flov1.RegisterTaskServiceServer(srv, f)
	flov1.RegisterWorkflowServiceServer(srv, flakyWorkflows{flakyTasks: f})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	client := flo.NewClient(lis.Addr().String(), flo.WithNamespace("myapp"))
	require.NoError(t, client.Connect())
	t.Cleanup(func() { _ = client.Close() })
	return f, client
}

func TestSafeCallsRetryAnUnavailableGateway(t *testing.T) {
	t.Parallel()
	f, client := startFlaky(t, 2)
	ctx := context.Background()

	task, err := client.GetTask(ctx, "t-9")
	require.NoError(t, err, "a read is retried")
	require.Equal(t, "t-9", task.ID)
	require.Equal(t, 3, f.count("GetTask"))

	_, err = client.Invoke(ctx, "send-email", map[string]string{"to": "a"})
	require.Equal(t, codes.Unavailable, status.Code(err), "an invoke is not sent twice: %v", err)
	require.Equal(t, 1, f.count("InvokeTask"))
	id, err := client.Invoke(ctx, "send-email", map[string]string{"to": "a"}, flo.WithIdempotencyKey("k"))
	require.NoError(t, err, "an invoke with a key names one task: it is sent again")
	require.Equal(t, "t-1", id)
	require.Equal(t, 3, f.count("InvokeTask"))

	run, err := client.StartWorkflow(ctx, "process-order", nil, flo.StartWorkflowOptions{IdempotencyKey: "order-1"})
	require.NoError(t, err, "a start with a key is sent again")
	require.Equal(t, "r-1", run.RunID)
	require.Equal(t, 3, f.count("StartRun"))
}

func TestKeyedRetriesGiveUp(t *testing.T) {
	t.Parallel()
	f, client := startFlaky(t, 100)

	_, err := client.StartWorkflow(context.Background(), "process-order", nil, flo.StartWorkflowOptions{IdempotencyKey: "order-1"})
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.ErrorContains(t, err, "start workflow process-order")
	require.Equal(t, 5, f.count("StartRun"), "five attempts in all")
	_, err = client.StartWorkflow(context.Background(), "process-order", nil, flo.StartWorkflowOptions{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Equal(t, 6, f.count("StartRun"), "a start without a key is sent once")
}
