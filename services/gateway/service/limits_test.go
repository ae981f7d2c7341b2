package service_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/harness"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestWorkerStreamsPastTheCapAreRefused runs a gateway that takes two worker
// streams: a third gets ResourceExhausted, other calls are served, and once a
// worker leaves a new one gets in.
func TestWorkerStreamsPastTheCapAreRefused(t *testing.T) {
	s := newStack(t, stackOptions{maxWorkerStreams: 2})
	hello := func(id string) *flov1.Hello {
		return &flov1.Hello{WorkerId: id, Namespace: "default", Actions: []string{"job"}}
	}
	// open opens a worker stream and returns its first answer's error.
	open := func(id string) error {
		ctx, cancel := context.WithCancel(testContext(t))
		stream, err := s.workers.Stream(ctx)
		if err != nil {
			cancel()
			return err
		}
		// A refused stream can end before the hello is sent: Send then
		// reports io.EOF and the Recv below has the server's status.
		if err := stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: hello(id)}}); err != nil && !errors.Is(err, io.EOF) {
			cancel()
			return err
		}
		_, err = stream.Recv()
		t.Cleanup(cancel)
		return err
	}

	first := openWorker(t, s, hello("w1"))
	openWorker(t, s, hello("w2"))
	err := open("w3")
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "error: %v", err)
	_, err = s.namespaces.ListNamespaces(testContext(t), &flov1.ListNamespacesRequest{})
	require.NoError(t, err)

	require.NoError(t, first.stream.CloseSend())
	<-first.done
	require.Eventually(t, func() bool { return open("w4") == nil }, wait, 10*time.Millisecond)
}

// TestConcurrentCallsPerConnectionAreCapped runs a gateway that takes one
// call at a time per connection: while a worker stream is open on a
// connection, another call on it waits, and a call on another connection is
// served.
func TestConcurrentCallsPerConnectionAreCapped(t *testing.T) {
	s := newStack(t, stackOptions{maxConcurrentStreams: 1})
	w := openWorker(t, s, &flov1.Hello{WorkerId: "w1", Namespace: "default", Actions: []string{"job"}})

	ctx, cancel := context.WithTimeout(testContext(t), 300*time.Millisecond)
	defer cancel()
	_, err := s.namespaces.ListNamespaces(ctx, &flov1.ListNamespacesRequest{})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "error: %v", err)

	other, err := grpc.NewClient(s.gateway.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(harness.Bearer(adminToken)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	_, err = flov1.NewNamespaceServiceClient(other).ListNamespaces(testContext(t), &flov1.ListNamespacesRequest{})
	require.NoError(t, err)

	require.NoError(t, w.stream.CloseSend())
	<-w.done
	_, err = s.namespaces.ListNamespaces(testContext(t), &flov1.ListNamespacesRequest{})
	require.NoError(t, err)
}
