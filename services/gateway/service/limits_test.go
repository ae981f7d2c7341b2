package service_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
		if err := stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: hello(id)}}); err != nil {
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
