package coalesce

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	waitFor = 10 * time.Second
	tick    = time.Millisecond
)

func TestBatcherCoalescesConcurrentCalls(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var (
		mu      sync.Mutex
		batches []int
	)
	b := New(100, 50, func(_ context.Context, calls []*Call[int, int]) error {
		mu.Lock()
		first := len(batches) == 0
		batches = append(batches, len(calls))
		mu.Unlock()
		if first {
			<-release // hold the first batch so the others pile up
		}
		for _, c := range calls {
			c.Resp = c.Req * 2
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.Run(ctx) }()

	firstDone := make(chan int)
	go func() {
		v, _ := b.Do(ctx, 0)
		firstDone <- v
	}()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(batches) == 1 }, waitFor, tick)

	var wg sync.WaitGroup
	results := make([]int, 20)
	for i := range results {
		wg.Go(func() {
			v, err := b.Do(ctx, i+1)
			require.NoError(t, err)
			results[i] = v
		})
	}
	// All 20 wait in the queue behind the held batch.
	require.Eventually(t, func() bool { return len(b.in) == 20 }, waitFor, tick)
	close(release)
	wg.Wait()
	require.Equal(t, 0, <-firstDone)
	for i, v := range results {
		require.Equal(t, 2*(i+1), v)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 20}, batches, "the calls that waited ran as one batch")
}

func TestBatcherErrorReachesEveryCall(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	b := New(10, 10, func(context.Context, []*Call[int, int]) error { return boom })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.Run(ctx) }()
	_, err := b.Do(ctx, 1)
	require.ErrorIs(t, err, boom)
}

func TestBatcherStopped(t *testing.T) {
	t.Parallel()
	b := New(10, 10, func(context.Context, []*Call[int, int]) error { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = b.Run(ctx); close(done) }()
	cancel()
	<-done
	_, err := b.Do(context.Background(), 1)
	require.ErrorIs(t, err, ErrStopped)
}

func TestBatcherSkipsCancelledCalls(t *testing.T) {
	t.Parallel()
	var seen int
	b := New(10, 10, func(_ context.Context, calls []*Call[int, int]) error {
		seen += len(calls)
		return nil
	})
	callCtx, cancelCall := context.WithCancel(context.Background())
	cancelCall()
	_, err := b.Do(callCtx, 1)
	require.ErrorIs(t, err, context.Canceled)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.Run(ctx) }()
	_, err = b.Do(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, 1, seen)
}

// lingering returns a Batcher lingering an hour, running until the test
// ends, and the sizes of the batches it ran.
func lingering(t *testing.T, maxBatch int) (*Batcher[int, int], func() []int) {
	var (
		mu      sync.Mutex
		batches []int
	)
	b := New(100, maxBatch, func(_ context.Context, calls []*Call[int, int]) error {
		mu.Lock()
		defer mu.Unlock()
		batches = append(batches, len(calls))
		for _, c := range calls {
			c.Resp = c.Req
		}
		return nil
	}).Linger(time.Hour)
	return b, func() []int { mu.Lock(); defer mu.Unlock(); return append([]int(nil), batches...) }
}

func TestBatcherLingersUntilFull(t *testing.T) {
	t.Parallel()
	b, batches := lingering(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.Run(ctx) }()
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			v, err := b.Do(ctx, i)
			require.NoError(t, err)
			require.Equal(t, i, v)
		})
	}
	wg.Wait()
	require.Equal(t, []int{3}, batches(), "the first call waited for the others, not an hour")
}

func TestBatcherLingeringBatchRunsAtStop(t *testing.T) {
	t.Parallel()
	b, batches := lingering(t, 10)
	answered := make(chan error, 1)
	go func() {
		_, err := b.Do(context.Background(), 1)
		answered <- err
	}()
	require.Eventually(t, func() bool { return len(b.in) == 1 }, waitFor, tick)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = b.Run(ctx); close(done) }()
	// Taken off the queue: the batch is lingering.
	require.Eventually(t, func() bool { return len(b.in) == 0 }, waitFor, tick)
	require.Empty(t, batches())
	cancel()
	<-done
	require.NoError(t, <-answered)
	require.Equal(t, []int{1}, batches())
}

func TestBatcherDoAllSharesBatches(t *testing.T) {
	t.Parallel()
	var (
		mu      sync.Mutex
		batches []int
	)
	b := New(100, 4, func(_ context.Context, calls []*Call[int, int]) error {
		mu.Lock()
		batches = append(batches, len(calls))
		mu.Unlock()
		for _, c := range calls {
			if c.Req%3 == 0 {
				c.Err = errors.New("no multiples of three")
				continue
			}
			c.Resp = c.Req * 2
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type answer struct {
		resps []int
		errs  []error
	}
	answered := make(chan answer)
	go func() {
		resps, errs := b.DoAll(ctx, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
		answered <- answer{resps, errs}
	}()
	// All ten are queued before the batcher runs, so they fill batches.
	require.Eventually(t, func() bool { return len(b.in) == 10 }, waitFor, tick)
	go func() { _ = b.Run(ctx) }()
	a := <-answered
	resps, errs := a.resps, a.errs
	for i, r := range resps {
		n := i + 1
		if n%3 == 0 {
			require.Error(t, errs[i], "call %d", n)
			continue
		}
		require.NoError(t, errs[i], "call %d", n)
		require.Equal(t, 2*n, r)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{4, 4, 2}, batches)
}
