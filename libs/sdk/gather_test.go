package flo

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// gatherPeer plays the gateway's TaskService: it names each task after its
// payload ("id-" + payload), holds every InvokeTask until release is closed,
// and answers an InvokeTasks with batchErr when that is set.
type gatherPeer struct {
	flov1.UnimplementedTaskServiceServer
	release  chan struct{}
	arrived  chan string
	batches  chan *flov1.InvokeTasksRequest
	batchErr error
}

func (p *gatherPeer) InvokeTask(ctx context.Context, req *flov1.InvokeTaskRequest) (*flov1.InvokeTaskResponse, error) {
	p.arrived <- string(req.GetPayload())
	select {
	case <-p.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if strings.HasPrefix(string(req.GetPayload()), "bad") {
		return nil, status.Errorf(codes.NotFound, "%s is refused", req.GetPayload())
	}
	return &flov1.InvokeTaskResponse{TaskId: "id-" + string(req.GetPayload())}, nil
}

func (p *gatherPeer) InvokeTasks(_ context.Context, req *flov1.InvokeTasksRequest) (*flov1.InvokeTasksResponse, error) {
	p.batches <- req
	if p.batchErr != nil {
		return nil, p.batchErr
	}
	ids := make([]string, len(req.GetTasks()))
	for i, item := range req.GetTasks() {
		ids[i] = "id-" + string(item.GetPayload())
	}
	return &flov1.InvokeTasksResponse{TaskIds: ids}, nil
}

func startGatherPeer(t *testing.T, batchErr error) (*gatherPeer, *Client) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &gatherPeer{release: make(chan struct{}), arrived: make(chan string, 100), batches: make(chan *flov1.InvokeTasksRequest, 10), batchErr: batchErr}
	srv := grpc.NewServer()
	flov1.RegisterTaskServiceServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	client := NewClient(lis.Addr().String(), WithNamespace("myapp"))
	require.NoError(t, client.Connect())
	t.Cleanup(func() { _ = client.Close() })
	return p, client
}

type invoked struct {
	id  string
	err error
}

// fillAndQueue starts gatherInFlight calls, which go out alone and are held
// by the peer, then the calls of payloads, which must wait for them, and
// returns once those are all queued.
func fillAndQueue(t *testing.T, p *gatherPeer, client *Client, ctxOf func(string) context.Context, payloads []string) map[string]chan invoked {
	t.Helper()
	answers := map[string]chan invoked{}
	invoke := func(payload string) {
		ch := make(chan invoked, 1)
		answers[payload] = ch
		go func() {
			id, err := client.Invoke(ctxOf(payload), "a", []byte(payload))
			ch <- invoked{id, err}
		}()
	}
	for i := range gatherInFlight {
		invoke(fmt.Sprintf("first-%d", i))
	}
	for range gatherInFlight {
		<-p.arrived
	}
	for _, payload := range payloads {
		invoke(payload)
	}
	g, err := client.gatherer()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.pending) == len(payloads)
	}, 10*time.Second, time.Millisecond, "the calls past the ones in flight wait in the queue")
	return answers
}

func TestALoneInvokeGoesAloneAndOverlappingOnesGoTogether(t *testing.T) {
	// Not parallel: it installs the global propagator.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator()) })
	p, client := startGatherPeer(t, nil)

	// Each caller has a trace of its own.
	traces := map[string]trace.TraceID{}
	var mu sync.Mutex
	ctxOf := func(payload string) context.Context {
		mu.Lock()
		defer mu.Unlock()
		id := trace.TraceID{byte(len(traces) + 1)}
		traces[payload] = id
		return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: id, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled,
		}))
	}
	queued := []string{"q-0", "q-1", "q-2", "q-3", "q-4", "q-5", "q-6"}
	answers := fillAndQueue(t, p, client, ctxOf, queued)
	close(p.release)

	for payload, ch := range answers {
		got := <-ch
		require.NoError(t, got.err)
		require.Equal(t, "id-"+payload, got.id, "each caller gets its own task's id")
	}
	batch := <-p.batches
	require.Equal(t, "myapp", batch.GetNamespace())
	require.Len(t, batch.GetTasks(), len(queued), "the queued calls went as one InvokeTasks")
	for _, item := range batch.GetTasks() {
		payload := string(item.GetPayload())
		mu.Lock()
		want := traces[payload]
		mu.Unlock()
		require.Equal(t, "a", item.GetAction())
		require.Contains(t, item.GetTraceContext()["traceparent"], want.String(), "the item of %s names its caller's trace", payload)
	}
	require.Empty(t, p.batches, "nothing else was gathered")

	// Nothing under way: a call goes alone, as an InvokeTask.
	id, err := client.Invoke(context.Background(), "a", []byte("alone"))
	require.NoError(t, err)
	require.Equal(t, "id-alone", id)
	require.Equal(t, "alone", <-p.arrived)
	require.Empty(t, p.batches)
}

// A batch refused for what one item says is sent again call by call, so
// only that item's caller gets the error.
func TestAGatheredBatchRefusedForOneItemAnswersEachCallAlone(t *testing.T) {
	p, client := startGatherPeer(t, status.Error(codes.NotFound, "tasks[1]: bad is refused"))
	answers := fillAndQueue(t, p, client, func(string) context.Context { return context.Background() }, []string{"ok-0", "bad", "ok-1"})
	close(p.release)
	for payload, ch := range answers {
		got := <-ch
		if payload == "bad" {
			require.Equal(t, codes.NotFound, status.Code(got.err), "error: %v", got.err)
			require.Contains(t, got.err.Error(), "bad is refused")
			continue
		}
		require.NoError(t, got.err, payload)
		require.Equal(t, "id-"+payload, got.id)
	}
	require.Len(t, (<-p.batches).GetTasks(), 3)
}

// A batch that fails as a whole fails every call in it. A caller that gives
// up returns at once without holding up the others, and its call, not yet
// sent, is dropped.
func TestAGatheredBatchThatFailsFailsEveryCall(t *testing.T) {
	p, client := startGatherPeer(t, status.Error(codes.Unavailable, "broker down"))
	ctx, cancel := context.WithCancel(context.Background())
	answers := fillAndQueue(t, p, client, func(payload string) context.Context {
		if payload == "impatient" {
			return ctx
		}
		return context.Background()
	}, []string{"q-0", "impatient", "q-1"})
	cancel()
	got := <-answers["impatient"]
	require.ErrorIs(t, got.err, context.Canceled)

	close(p.release)
	for _, payload := range []string{"q-0", "q-1"} {
		got := <-answers[payload]
		require.Equal(t, codes.Unavailable, status.Code(got.err), "error: %v", got.err)
	}
	batch := (<-p.batches).GetTasks()
	require.Len(t, batch, 2, "the impatient call was not sent")
	for _, item := range batch {
		require.NotEqual(t, "impatient", string(item.GetPayload()))
	}
}

// A lone call runs on its caller's goroutine. A caller that gives up while
// it is under way gets its context's error, and its turn is given back:
// gatherInFlight calls after it still go out alone.
func TestALoneInvokeWhoseCallerGivesUpGivesBackItsTurn(t *testing.T) {
	p, client := startGatherPeer(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := client.Invoke(ctx, "a", []byte("impatient"))
		gaveUp <- err
	}()
	require.Equal(t, "impatient", <-p.arrived)
	cancel()
	require.ErrorIs(t, <-gaveUp, context.Canceled)

	answers := fillAndQueue(t, p, client, func(string) context.Context { return context.Background() }, []string{"q-0"})
	close(p.release)
	for payload, ch := range answers {
		got := <-ch
		require.NoError(t, got.err, payload)
		require.Equal(t, "id-"+payload, got.id)
	}
	require.Equal(t, "q-0", <-p.arrived, "the call past the turns waited for one, then went alone")
	require.Empty(t, p.batches)
}
