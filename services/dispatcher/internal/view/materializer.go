package view

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/retry"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
)

const (
	// window is how long states gather before a flush: a task changed
	// several times within it is written once.
	window = 100 * time.Millisecond
	// maxBatch bounds the tasks of one flush (one statement, one
	// transaction); a buffer that reaches it is flushed at once.
	maxBatch = 10_000
)

// flushRetry spaces the attempts at a flush that failed (Postgres down or
// unreachable); the buffer keeps growing meanwhile.
var flushRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// Entry is one committed record's task state, for the view. A state without
// a status (a REJECTED invocation's) is no task: it moves the offsets only.
type Entry struct {
	Partition int32
	// Offset is the record's events offset.
	Offset int64
	// CmdOffset is the record's checkpoint: the next commands offset of the
	// partition consumed when it was produced.
	CmdOffset int64
	Task      engine.Task
}

// buffered is the latest state of one task since it was last taken, and the
// first events offset folded into it.
type buffered struct {
	Entry
	first int64
}

// batch is what one flush writes.
type batch struct {
	rows  [][]any
	marks []mark
	// states counts the entries taken, rejections included.
	states int
}

// Materializer writes committed task states to the tasks table in batches:
// the hot path hands it states and never waits for Postgres.
type Materializer struct {
	pool      *pgxpool.Pool
	log       *slog.Logger
	onFlushed func(partition int32, offset int64)
	meter     metric.Meter
	lag       metric.Int64ObservableGauge
	written   metric.Int64Counter

	mu   sync.Mutex
	buf  map[uuid.UUID]*buffered
	full chan struct{}

	// flushMu serialises flushes, so a partition's offsets and rows are
	// written in order.
	flushMu sync.Mutex
	// pending are the batches taken from buf and not written yet, in the
	// order they must be written; a failed flush keeps them for the next
	// try.
	pending    []*batch
	pendingLen atomic.Int64
}

// NewMaterializer returns a materializer writing through pool. States gather
// for 100 ms, or until 10,000 tasks are buffered, before a flush; onFlushed,
// when not nil, is called after each commit with the highest events offset
// now in the view for each partition the flush wrote. It is called with the
// flush lock held, so it must not call Flush.
func NewMaterializer(pool *pgxpool.Pool, log *slog.Logger, meter metric.Meter, onFlushed func(partition int32, offset int64)) (*Materializer, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if onFlushed == nil {
		onFlushed = func(int32, int64) {}
	}
	lag, err := meter.Int64ObservableGauge("flo.dispatcher.view.lag", metric.WithUnit("{task}"),
		metric.WithDescription("Task states committed to the log and not written to the tasks view yet."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	written, err := meter.Int64Counter("flo.dispatcher.view.rows_written", metric.WithUnit("{row}"),
		metric.WithDescription("Rows of the tasks view inserted or updated by the materializer."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	return &Materializer{
		pool: pool, log: log, onFlushed: onFlushed, meter: meter, lag: lag, written: written,
		buf: make(map[uuid.UUID]*buffered), full: make(chan struct{}, 1),
	}, nil
}

// Add buffers committed states; it never waits for Postgres. Of one task only
// the state of the highest offset is kept, with the payload and result of an
// earlier state when it has none. Add takes entries of a partition in offset
// order.
func (m *Materializer) Add(entries ...Entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range entries {
		b, ok := m.buf[e.Task.ID]
		if !ok {
			m.buf[e.Task.ID] = &buffered{Entry: e, first: e.Offset}
			continue
		}
		b.first = min(b.first, e.Offset)
		older, newer := &e.Task, &b.Task
		if e.Offset > b.Offset {
			older, newer = &b.Task, &e.Task
		}
		if newer.Payload == nil {
			newer.Payload = older.Payload
		}
		if newer.Result == nil {
			newer.Result = older.Result
		}
		if e.Offset > b.Offset {
			b.Entry = e
		}
	}
	if len(m.buf) >= maxBatch {
		select {
		case m.full <- struct{}{}:
		default:
		}
	}
}

// Run flushes every 100 ms, and at once when the buffer is full, until ctx
// ends; then it returns nil (Flush writes what is left). A failed flush is
// retried with backoff while states keep buffering; each streak of failures
// is logged once.
func (m *Materializer) Run(ctx context.Context) error {
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(m.lag, m.Lag())
		return nil
	}, m.lag)
	if err != nil {
		return fmt.Errorf("register view metrics: %w", err)
	}
	defer func() { _ = reg.Unregister() }()
	tick := time.NewTicker(window)
	defer tick.Stop()
	backoff := flushRetry.Backoff()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-m.full:
		}
		for {
			m.flushMu.Lock()
			err := m.flushTaken(ctx)
			m.flushMu.Unlock()
			if ctx.Err() != nil {
				return nil
			}
			if err == nil {
				break
			}
			if failures == 0 {
				m.log.WarnContext(ctx, "write task view failed; retrying while states buffer", "buffered", m.Lag(), "error", err)
			}
			failures++
			if !retry.Sleep(ctx, backoff.NextBackOff()) {
				return nil
			}
		}
		if failures > 0 {
			m.log.InfoContext(ctx, "write task view recovered", "failed_attempts", failures)
			failures = 0
		}
		backoff.Reset()
	}
}

// Flush writes what is buffered now, in as many transactions as it takes
// (10,000 tasks each); on error what was not written stays buffered.
func (m *Materializer) Flush(ctx context.Context) error {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	// Twice: batches a failed flush left come before the buffer.
	for range 2 {
		if err := m.flushTaken(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Lag is how many task states are buffered and not written yet.
func (m *Materializer) Lag() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.buf)) + m.pendingLen.Load()
}

// flushTaken writes the pending batches, taking what is buffered first when
// there are none. The caller holds flushMu.
func (m *Materializer) flushTaken(ctx context.Context) error {
	if len(m.pending) == 0 {
		m.pending = m.take()
	}
	for len(m.pending) > 0 {
		b := m.pending[0]
		var n int64
		err := pg.InTx(ctx, m.pool, func(tx pgx.Tx) error {
			var err error
			n, err = write(ctx, tx, b.rows, b.marks)
			return err
		})
		if err != nil {
			return err
		}
		m.written.Add(ctx, n)
		for _, mk := range b.marks {
			m.onFlushed(mk.partition, mk.last)
		}
		// Last, so a Lag of zero means the states are written and
		// announced.
		m.pending = m.pending[1:]
		m.pendingLen.Add(-int64(b.states))
	}
	return nil
}

// take moves every buffered state into batches of up to maxBatch tasks,
// holding the buffer's lock only to swap it for an empty one. Over one batch,
// states are written in offset order, and a batch's events offset for a
// partition stops before the first record folded into a state of a later
// batch, so the view's offsets never pass a state it lacks.
func (m *Materializer) take() []*batch {
	m.mu.Lock()
	buf := m.buf
	m.buf = make(map[uuid.UUID]*buffered, len(buf))
	// Under mu, so Lag never misses the states between buf and pending.
	m.pendingLen.Store(int64(len(buf)))
	m.mu.Unlock()
	if len(buf) == 0 {
		return nil
	}
	all := make([]*buffered, 0, len(buf))
	for _, b := range buf {
		all = append(all, b)
	}
	if len(all) > maxBatch {
		slices.SortFunc(all, func(a, b *buffered) int { return cmp.Compare(a.Offset, b.Offset) })
	}
	out := make([]*batch, (len(all)+maxBatch-1)/maxBatch)
	// stop[p] is the first offset of p in the batches after the one being
	// made: built from the last batch back.
	stop := make(map[int32]int64)
	for i := len(out) - 1; i >= 0; i-- {
		chunk := all[i*maxBatch : min((i+1)*maxBatch, len(all))]
		out[i] = newBatch(chunk, stop)
		for _, b := range chunk {
			if s, ok := stop[b.Partition]; !ok || b.first < s {
				stop[b.Partition] = b.first
			}
		}
	}
	return out
}

// newBatch makes the batch writing states, whose partitions' events offsets
// stop at stop's when it has one.
func newBatch(states []*buffered, stop map[int32]int64) *batch {
	out := &batch{rows: make([][]any, 0, len(states)), states: len(states)}
	index := make(map[int32]int)
	for _, b := range states {
		if b.Task.Status != "" {
			out.rows = append(out.rows, row(b.Entry))
		}
		i, ok := index[b.Partition]
		if !ok {
			i = len(out.marks)
			index[b.Partition] = i
			out.marks = append(out.marks, mark{partition: b.Partition, last: -1})
		}
		out.marks[i].last = max(out.marks[i].last, b.Offset)
	}
	for i := range out.marks {
		mk := &out.marks[i]
		mk.events = mk.last + 1
		if s, ok := stop[mk.partition]; ok {
			mk.events = min(mk.events, s)
		}
	}
	// A partition's commands offset is the checkpoint of the last state
	// below its events offset (checkpoints grow with offsets).
	for _, b := range states {
		mk := &out.marks[index[b.Partition]]
		if b.Offset < mk.events {
			mk.commands = max(mk.commands, b.CmdOffset)
		}
	}
	// Offsets rows are locked in partition order, as two writers may share
	// partitions while ownership moves.
	slices.SortFunc(out.marks, func(a, b mark) int { return cmp.Compare(a.partition, b.partition) })
	return out
}
