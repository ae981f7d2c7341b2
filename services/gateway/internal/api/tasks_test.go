package api

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// The batch byte limit is checked before anything else is looked up, so a
// server without dependencies shows it; the end-to-end tests in service
// cover the rest of InvokeTasks.
func TestInvokeTasksBoundsTheBatchBytes(t *testing.T) {
	s := NewTaskServer(TaskServerDeps{MaxPayloadBytes: 10, MaxBatchBytes: 25})
	item := &flov1.InvokeTaskRequest{Action: "a", Payload: make([]byte, 10)}
	_, err := s.InvokeTasks(context.Background(), &flov1.InvokeTasksRequest{Namespace: "ns", Tasks: []*flov1.InvokeTaskRequest{item, item, item}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "error: %v", err)
	require.Contains(t, status.Convert(err).Message(), "tasks[0..2] add up to more than the batch limit of 25 bytes")

	// One item at the payload limit always fits, whatever the batch limit.
	require.Equal(t, 10, NewTaskServer(TaskServerDeps{MaxPayloadBytes: 10, MaxBatchBytes: 5}).maxBatchBytes)
}
