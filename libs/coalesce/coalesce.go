// Package coalesce gathers concurrent requests and executes them together, so
// many callers share one database transaction instead of each paying for its
// own. One goroutine executes; requests that arrive while it is busy form the
// next batch, so batches grow with load and latency stays one round trip when
// idle.
package coalesce

import (
	"context"
	"errors"
	"time"
)

// ErrStopped is returned to calls made after the Batcher stopped.
var ErrStopped = errors.New("coalescer stopped")

// execTimeout bounds one batch execution; it runs detached from the Run
// context so a batch in flight at shutdown still commits.
const execTimeout = 30 * time.Second

// Call is one request in a batch; the executor sets Resp or Err.
type Call[Q, R any] struct {
	Ctx  context.Context
	Req  Q
	Resp R
	Err  error
	done chan struct{}
}

// Batcher coalesces calls of request type Q and response type R.
type Batcher[Q, R any] struct {
	in       chan *Call[Q, R]
	maxBatch int
	exec     func(ctx context.Context, calls []*Call[Q, R]) error
	stopped  chan struct{}
	linger   time.Duration
}

// New returns a Batcher whose queue holds up to queue waiting calls (callers
// block beyond that: back-pressure) and whose batches hold up to maxBatch
// calls. exec runs one batch; an error it returns becomes every call's error.
func New[Q, R any](queue, maxBatch int, exec func(ctx context.Context, calls []*Call[Q, R]) error) *Batcher[Q, R] {
	return &Batcher[Q, R]{in: make(chan *Call[Q, R], queue), maxBatch: maxBatch, exec: exec, stopped: make(chan struct{})}
}

// Linger makes a batch wait up to d after its first call for more (until
// it is full) before it runs, so calls that trickle in (heartbeats spread
// over their interval) share a transaction too, at the price of up to d of
// latency. Call it before Run; it returns b.
func (b *Batcher[Q, R]) Linger(d time.Duration) *Batcher[Q, R] {
	b.linger = d
	return b
}

// Do submits req and waits for its batch to run.
func (b *Batcher[Q, R]) Do(ctx context.Context, req Q) (R, error) {
	c := b.call(ctx, req)
	if err := b.submit(c); err != nil {
		var zero R
		return zero, err
	}
	return b.wait(c)
}

// DoAll submits reqs together, so they share batches instead of each
// waiting for the one before, and waits for all of them: resps[i] and
// errs[i] answer reqs[i]. One that could not be queued gets the reason in
// its errs.
func (b *Batcher[Q, R]) DoAll(ctx context.Context, reqs []Q) (resps []R, errs []error) {
	calls := make([]*Call[Q, R], len(reqs))
	errs = make([]error, len(reqs))
	for i, req := range reqs {
		calls[i] = b.call(ctx, req)
		errs[i] = b.submit(calls[i])
	}
	resps = make([]R, len(reqs))
	for i, c := range calls {
		if errs[i] == nil {
			resps[i], errs[i] = b.wait(c)
		}
	}
	return resps, errs
}

func (b *Batcher[Q, R]) call(ctx context.Context, req Q) *Call[Q, R] {
	return &Call[Q, R]{Ctx: ctx, Req: req, done: make(chan struct{})}
}

// submit queues c, waiting for room.
func (b *Batcher[Q, R]) submit(c *Call[Q, R]) error {
	select {
	case b.in <- c:
		return nil
	case <-c.Ctx.Done():
		return c.Ctx.Err()
	case <-b.stopped:
		return ErrStopped
	}
}

// wait waits for the batch of a queued c to run.
func (b *Batcher[Q, R]) wait(c *Call[Q, R]) (R, error) {
	var zero R
	select {
	case <-c.done:
		return c.Resp, c.Err
	case <-c.Ctx.Done():
		return zero, c.Ctx.Err()
	case <-b.stopped:
		// The call may have slipped into the queue after the final drain.
		select {
		case <-c.done:
			return c.Resp, c.Err
		default:
			return zero, ErrStopped
		}
	}
}

// Run executes batches until ctx ends, then fails calls still queued.
func (b *Batcher[Q, R]) Run(ctx context.Context) error {
	defer b.stop()
	batch := make([]*Call[Q, R], 0, b.maxBatch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return nil
		case c := <-b.in:
			batch = append(batch, c)
		}
		batch = b.gather(ctx, batch)
	drain:
		for len(batch) < b.maxBatch {
			select {
			case c := <-b.in:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		b.run(ctx, batch)
	}
}

// gather adds the calls that arrive within the linger time to batch; a
// batch cut short by ctx ending still runs.
func (b *Batcher[Q, R]) gather(ctx context.Context, batch []*Call[Q, R]) []*Call[Q, R] {
	if b.linger <= 0 {
		return batch
	}
	timer := time.NewTimer(b.linger)
	defer timer.Stop()
	for len(batch) < b.maxBatch {
		select {
		case c := <-b.in:
			batch = append(batch, c)
		case <-timer.C:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

func (b *Batcher[Q, R]) run(ctx context.Context, batch []*Call[Q, R]) {
	live := batch[:0:0]
	for _, c := range batch {
		if err := c.Ctx.Err(); err != nil {
			c.Err = err
			close(c.done)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	execCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), execTimeout)
	err := b.exec(execCtx, live)
	cancel()
	for _, c := range live {
		if err != nil {
			c.Err = err
		}
		close(c.done)
	}
}

func (b *Batcher[Q, R]) stop() {
	close(b.stopped)
	for {
		select {
		case c := <-b.in:
			c.Err = ErrStopped
			close(c.done)
		default:
			return
		}
	}
}
