package workerstream

import "sync"

// runQueue is a bounded FIFO served by a goroutine that runs only while the
// queue holds something: the first put starts it and it ends when it finds
// the queue empty, so an idle session keeps neither a goroutine nor a buffer
// for it. The buffer grows with what is queued, up to max, and is let go
// when the queue empties. One item is served at a time, in order; serve may
// take more with next.
type runQueue[T any] struct {
	mu    sync.Mutex
	items []T
	max   int
	serve func(T)
	// running is whether the serving goroutine is started; it is set and
	// cleared under mu together with the check of items, so no item is
	// left without one.
	running bool
	closed  bool
	// space, when not nil, is closed as soon as an item is taken: puts
	// waiting for room wait on it.
	space chan struct{}
	wg    sync.WaitGroup
}

func (q *runQueue[T]) init(max int, serve func(T)) {
	q.max, q.serve = max, serve
}

// put queues item, waiting while the queue is full. It reports false, and
// queues nothing, once the queue is closed or when done closes before there
// is room.
func (q *runQueue[T]) put(item T, done <-chan struct{}) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) >= q.max && !q.closed {
		if q.space == nil {
			q.space = make(chan struct{})
		}
		space := q.space
		q.mu.Unlock()
		select {
		case <-space:
		case <-done:
			q.mu.Lock()
			return false
		}
		q.mu.Lock()
	}
	if q.closed {
		return false
	}
	q.items = append(q.items, item)
	if !q.running {
		q.running = true
		q.wg.Go(q.run)
	}
	return true
}

func (q *runQueue[T]) run() {
	for {
		q.mu.Lock()
		item, ok := q.takeLocked()
		if !ok {
			q.running = false
		}
		q.mu.Unlock()
		if !ok {
			return
		}
		q.serve(item)
	}
}

// next takes the next item if there is one, for serve to gather a batch.
func (q *runQueue[T]) next() (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.takeLocked()
}

func (q *runQueue[T]) takeLocked() (T, bool) {
	var item T
	if len(q.items) == 0 {
		return item, false
	}
	item = q.items[0]
	if len(q.items) == 1 {
		q.items = nil
	} else {
		var zero T
		q.items[0] = zero
		q.items = q.items[1:]
	}
	if q.space != nil {
		close(q.space)
		q.space = nil
	}
	return item, true
}

// close refuses further puts and waits until everything queued is served.
func (q *runQueue[T]) close() {
	q.mu.Lock()
	q.closed = true
	if q.space != nil {
		close(q.space)
		q.space = nil
	}
	q.mu.Unlock()
	q.wg.Wait()
}
