package flo

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Limits of the invoke gatherer. A few batches in flight keep the
// connection busy while the next ones gather; 1 MiB of payloads keeps a
// batch well inside the gateway's batch limit (4 MiB by default).
const (
	gatherInFlight = 4
	gatherMaxBytes = 1 << 20
)

// invokeGatherer sends the Invoke calls of one client that overlap in time
// as InvokeTasks calls. A call that finds fewer than gatherInFlight calls
// under way is sent at once, alone, as the InvokeTask it would have been;
// calls that arrive while gatherInFlight are under way wait for the first
// to finish and go together. So a lone caller pays nothing, and many callers
// share one round trip, one request to the gateway and one produce per
// batch instead of one each. The services gather their calls with
// libs/coalesce; the SDK is a module of its own that applications import,
// and does not depend on the services' libraries.
type invokeGatherer struct {
	svc flov1.TaskServiceClient

	mu       sync.Mutex
	pending  []*gathered
	inFlight int
}

// gathered is one Invoke call waiting for its batch.
type gathered struct {
	ctx  context.Context
	req  *flov1.InvokeTaskRequest
	id   string
	err  error
	done chan struct{}
}

// invoke queues req and waits for its answer or for ctx to end. A call
// that ctx ended after it was sent may still create its task, as a unary
// call may.
func (g *invokeGatherer) invoke(ctx context.Context, req *flov1.InvokeTaskRequest) (string, error) {
	call := &gathered{ctx: ctx, req: req, done: make(chan struct{})}
	g.mu.Lock()
	if g.inFlight < gatherInFlight && len(g.pending) == 0 {
		// Nothing waits for a turn: the call goes alone on the caller's
		// own goroutine, whose stack has already grown to what a gRPC call
		// needs, where a new goroutine per call would grow one each time.
		g.inFlight++
		g.mu.Unlock()
		id, err := g.one(call)
		if batch, ok := g.next(); ok {
			go g.drain(batch)
		}
		if err != nil && ctx.Err() != nil {
			return "", ctx.Err()
		}
		return id, err
	}
	g.pending = append(g.pending, call)
	start := g.inFlight < gatherInFlight
	var batch []*gathered
	if start {
		g.inFlight++
		batch = g.take()
	}
	g.mu.Unlock()
	if start {
		go g.drain(batch)
	}
	select {
	case <-call.done:
		return call.id, call.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// take removes the next batch from pending; g.mu is held. A call whose
// caller gave up before it was sent is dropped: it creates no task.
func (g *invokeGatherer) take() []*gathered {
	var batch []*gathered
	n, bytes := 0, 0
	for ; n < len(g.pending) && len(batch) < MaxInvokeBatch; n++ {
		c := g.pending[n]
		if c.ctx.Err() != nil {
			continue
		}
		bytes += len(c.req.GetPayload())
		if len(batch) > 0 && bytes > gatherMaxBytes {
			break
		}
		batch = append(batch, c)
	}
	rest := copy(g.pending, g.pending[n:])
	clear(g.pending[rest:])
	g.pending = g.pending[:rest]
	return batch
}

// drain sends batch, then the batches that gathered meanwhile, until none
// is left.
func (g *invokeGatherer) drain(batch []*gathered) {
	for ok := true; ok; batch, ok = g.next() {
		if len(batch) > 0 {
			g.send(batch)
		}
	}
}

// next ends a send: it takes the batch that gathered while the send was
// under way, or, when nothing did (ok false), gives up the send's turn.
func (g *invokeGatherer) next() (batch []*gathered, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.pending) == 0 {
		g.inFlight--
		return nil, false
	}
	return g.take(), true
}

// itemErrorCodes are the codes of an InvokeTasks answer that may concern
// one item only. The gateway checks every item before it queues any, so on
// these nothing was created, and each call is sent again alone to get its
// own answer.
var itemErrorCodes = map[codes.Code]bool{
	codes.InvalidArgument:    true,
	codes.NotFound:           true,
	codes.FailedPrecondition: true,
}

// send answers every call of batch.
func (g *invokeGatherer) send(batch []*gathered) {
	if len(batch) == 1 {
		batch[0].answer(g.one(batch[0]))
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	reqs := make([]*flov1.InvokeTaskRequest, len(batch))
	for i, c := range batch {
		// The call carries the first caller's trace context; each task
		// names its own caller's.
		tc := propagation.MapCarrier{}
		otel.GetTextMapPropagator().Inject(c.ctx, tc)
		if len(tc) > 0 {
			c.req.TraceContext = tc
		}
		reqs[i] = c.req
	}
	resp, err := g.svc.InvokeTasks(ctx, &flov1.InvokeTasksRequest{Namespace: batch[0].req.GetNamespace(), Tasks: reqs})
	switch {
	case err == nil && len(resp.GetTaskIds()) != len(batch):
		err = status.Errorf(codes.Internal, "flo: the gateway answered %d task ids for %d invocations", len(resp.GetTaskIds()), len(batch))
	case err == nil:
		for i, c := range batch {
			c.answer(resp.GetTaskIds()[i], nil)
		}
		return
	case itemErrorCodes[status.Code(err)]:
		var wg sync.WaitGroup
		for _, c := range batch {
			wg.Go(func() { c.answer(g.one(c)) })
		}
		wg.Wait()
		return
	}
	for _, c := range batch {
		c.answer("", err)
	}
}

// one sends c alone, with its own context.
func (g *invokeGatherer) one(c *gathered) (string, error) {
	resp, err := g.svc.InvokeTask(c.ctx, c.req)
	return resp.GetTaskId(), err
}

func (c *gathered) answer(id string, err error) {
	c.id, c.err = id, err
	close(c.done)
}

// batchContext is the context of a batch's call: it outlives any one
// caller, whose own context ends only its own wait, and ends at the latest
// of the callers' deadlines when all have one.
func batchContext(batch []*gathered) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(batch[0].ctx))
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
}
