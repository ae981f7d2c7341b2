package flo_test

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"testing"
	"time"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// batchPeer plays the gateway's TaskService for InvokeMany: it records the request and
// answers with one id per item, or with err.
type batchPeer struct {
	flov1.UnimplementedTaskServiceServer
	got chan *flov1.InvokeTasksRequest
	err error
}

func (p *batchPeer) InvokeTasks(_ context.Context, req *flov1.InvokeTasksRequest) (*flov1.InvokeTasksResponse, error) {
	p.got <- req
	if p.err != nil {
		return nil, p.err
	}
	ids := make([]string, len(req.GetTasks()))
	for i := range ids {
		ids[i] = "task-" + strconv.Itoa(i)
	}
	return &flov1.InvokeTasksResponse{TaskIds: ids}, nil
}

func startBatchPeer(t *testing.T, err error) (*batchPeer, *flo.Client) {
	t.Helper()
	lis, lerr := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, lerr)
	p := &batchPeer{got: make(chan *flov1.InvokeTasksRequest, 1), err: err}
	srv := grpc.NewServer()
	flov1.RegisterTaskServiceServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	client := flo.NewClient(lis.Addr().String(), flo.WithNamespace("myapp"))
	require.NoError(t, client.Connect())
	t.Cleanup(func() { _ = client.Close() })
	return p, client
}

func TestInvokeManySendsOneBatch(t *testing.T) {
	p, client := startBatchPeer(t, nil)
	ids, err := client.InvokeMany(context.Background(), "send-email",
		[]any{map[string]string{"to": "a"}, []byte("raw"), nil}, flo.WithPriority(3), flo.WithDelay(time.Second))
	require.NoError(t, err)
	require.Equal(t, []string{"task-0", "task-1", "task-2"}, ids)

	req := <-p.got
	require.Equal(t, "myapp", req.GetNamespace())
	require.Len(t, req.GetTasks(), 3)
	var first map[string]string
	require.NoError(t, json.Unmarshal(req.GetTasks()[0].GetPayload(), &first))
	require.Equal(t, map[string]string{"to": "a"}, first)
	require.Equal(t, []byte("raw"), req.GetTasks()[1].GetPayload())
	require.Empty(t, req.GetTasks()[2].GetPayload())
	for _, item := range req.GetTasks() {
		require.Equal(t, "send-email", item.GetAction())
		require.EqualValues(t, 3, item.GetPriority())
		require.EqualValues(t, 1000, item.GetDelayMs())
	}
}

func TestInvokeManyRefusesWhatCannotWork(t *testing.T) {
	p, client := startBatchPeer(t, status.Error(codes.NotFound, `tasks[1]: action "x" not found`))
	ctx := context.Background()

	ids, err := client.InvokeMany(ctx, "x", nil)
	require.NoError(t, err, "no payloads is no call")
	require.Empty(t, ids)

	_, err = client.InvokeMany(ctx, "x", []any{1, 2}, flo.WithIdempotencyKey("k"))
	require.ErrorContains(t, err, "idempotency key")

	_, err = client.InvokeMany(ctx, "x", []any{func() {}})
	require.ErrorContains(t, err, "payload 0")

	_, err = client.InvokeMany(ctx, "x", []any{1, 2})
	require.Equal(t, codes.NotFound, status.Code(err))
	require.ErrorContains(t, err, "tasks[1]")
	require.Len(t, (<-p.got).GetTasks(), 2)
}
