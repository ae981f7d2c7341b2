package view

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/kafka"
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
	// liveHold is how long the state of a live task (queued, running,
	// waiting) may wait in the buffer for a newer one: most tasks end
	// within it, and their row is then written once, in its final state,
	// instead of once per window they lived through. The view's offsets
	// stay before a held state, so a rebuild reads it from the log.
	liveHold = 2 * time.Second
	// maxHeld bounds the live states held back; past it the oldest are
	// written at the next flush, whatever their age.
	maxHeld = 4 * maxBatch
)

var (
	// flushRetry spaces the attempts at a flush that failed (Postgres down
	// or unreachable); the buffer keeps growing meanwhile.
	flushRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}
	// refusedRetry spaces Run's attempts at refused states: soon enough
	// that a fixed cause lets them land within seconds, and further apart
	// while nothing lands, as each attempt bisects them again.
	refusedRetry = retry.Policy{Initial: 2 * time.Second, Max: time.Minute}
)

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

// buffered is the latest state of one task since it was last written, and
// the first events offset folded into it: the view lacks the task's
// records from there on.
type buffered struct {
	Entry
	first int64
	// refused is set once Postgres refused this state, or an older one
	// folded into it, and the refusal was logged and counted.
	refused bool
	// added is when the oldest state folded into this one was buffered.
	added time.Time
	// held is set while the state waits in its partition's held queue; a
	// state taken before its time (a newer, final state replaced it) stays
	// in the queue with held unset, and is skipped there.
	held bool
}

// holdable reports whether b may wait for a newer state: a live task's.
func (b *buffered) holdable() bool { return b.Task.Status != "" && !b.Task.Final() }

// fold makes b the newer of b and o, two states of one task, with the
// payload and result of the older when the newer has none.
func (b *buffered) fold(o *buffered) {
	b.first = min(b.first, o.first)
	b.refused = b.refused || o.refused
	if o.added.Before(b.added) {
		b.added = o.added
	}
	older, newer := &o.Task, &b.Task
	if o.Offset > b.Offset {
		older, newer = &b.Task, &o.Task
	}
	if newer.Payload == nil {
		newer.Payload = older.Payload
	}
	if newer.Result == nil {
		newer.Result = older.Result
	}
	if o.Offset > b.Offset {
		b.Entry = o.Entry
	}
}

// batch is what one flush writes.
type batch struct {
	// states are every state taken, rejections included.
	states []*buffered
	// owners are the states with a status: the rows the batch writes.
	owners []*buffered
	// stop holds, per partition, the first events offset of the states
	// left to the batches after this one.
	stop map[int32]int64
}

// Materializer writes committed task states to the tasks table in batches:
// the hot path hands it states and never waits for Postgres.
type Materializer struct {
	pool *pgxpool.Pool
	// partitions is the partition count the states it is given are keyed
	// by (see ErrRekeyed).
	partitions int32
	log        *slog.Logger
	onFlushed  func(partition int32, offset int64)
	meter      metric.Meter
	lag        metric.Int64ObservableGauge
	written    metric.Int64Counter
	refusals   metric.Int64Counter

	mu sync.Mutex
	// buf is every state not taken yet, by task: those added since the
	// last take and those held back.
	buf map[uuid.UUID]*buffered
	// fresh are the states put in buf since the last take, in the order
	// they came; due are held states a final one replaced since then.
	fresh, due []*buffered
	// held are the states held back, by partition, oldest first: the order
	// of their first records too, as a partition adds in offset order.
	held    map[int32][]*buffered
	heldLen int
	full    chan struct{}

	// flushMu serialises flushes, so a partition's offsets and rows are
	// written in order; it guards the fields below.
	flushMu sync.Mutex
	// pending are the batches taken from buf and not written yet, in the
	// order they must be written; a failed flush keeps them for the next
	// try.
	pending    []*batch
	pendingLen atomic.Int64
	// refused are the states Postgres refused, by task, until they land or
	// a newer state of their task does.
	refused    map[uuid.UUID]*buffered
	refusedLen atomic.Int64
	// refusedNext is when Run tries the refused states again.
	refusedNext    time.Time
	refusedBackoff interface {
		NextBackOff() time.Duration
		Reset()
	}
	// reached is, per partition, how far the written states take it,
	// refusals aside: where its offsets go once nothing refused holds
	// them back.
	reached map[int32]mark
}

// NewMaterializer returns a materializer writing through pool states keyed
// by partitions partitions. States gather for 100 ms, or until 10,000 tasks
// besides those held back are buffered, before a flush; onFlushed, when not
// nil, is called after each commit with the highest events offset up to
// which the view holds every state, for each partition the flush wrote,
// short of any state Postgres refused or that is held back. It is called
// with the flush lock held, so it must not call Flush.
func NewMaterializer(pool *pgxpool.Pool, partitions int32, log *slog.Logger, meter metric.Meter, onFlushed func(partition int32, offset int64)) (*Materializer, error) {
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
	refusals, err := meter.Int64Counter("flo.dispatcher.view.refused", metric.WithUnit("{task}"),
		metric.WithDescription("Task states Postgres refused to store in the tasks view (each task counted once until it lands)."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	return &Materializer{
		pool: pool, partitions: partitions, log: log, onFlushed: onFlushed, meter: meter, lag: lag, written: written, refusals: refusals,
		buf: make(map[uuid.UUID]*buffered), held: make(map[int32][]*buffered), full: make(chan struct{}, 1),
		refused: make(map[uuid.UUID]*buffered), refusedBackoff: refusedRetry.Backoff(), reached: make(map[int32]mark),
	}, nil
}

// Add buffers committed states; it never waits for Postgres. Of one task only
// the state of the highest offset is kept, with the payload and result of an
// earlier state when it has none. Add takes entries of a partition in offset
// order.
func (m *Materializer) Add(entries ...Entry) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range entries {
		// Most states fold into one already buffered: only a new task's is
		// moved to the heap.
		s := buffered{Entry: e, first: e.Offset, added: now}
		if b, ok := m.buf[e.Task.ID]; ok {
			b.fold(&s)
			if b.held && !b.holdable() {
				b.held = false
				m.heldLen--
				m.due = append(m.due, b)
			}
			continue
		}
		b := new(buffered)
		*b = s
		m.buf[e.Task.ID] = b
		m.fresh = append(m.fresh, b)
	}
	// Up to maxHeld of the buffer may be live states held back.
	if len(m.buf) >= maxBatch+maxHeld {
		select {
		case m.full <- struct{}{}:
		default:
		}
	}
}

// Run flushes every 100 ms, and at once when the buffer is full, until ctx
// ends; then it returns nil (Flush writes what is left). Its flushes hold
// back live states younger than liveHold (see take). A failed flush is
// retried with backoff while states keep buffering; each streak of failures
// is logged once. Refused states are tried again after 2 s, then further
// apart (up to a minute) while none of them lands. A view repartitioned
// under it ends Run with ErrRekeyed.
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
			err := m.flushTaken(ctx, false, false)
			m.flushMu.Unlock()
			if ctx.Err() != nil {
				return nil
			}
			if err == nil {
				break
			}
			if errors.Is(err, ErrRekeyed) {
				return err
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

// Flush writes what is buffered now, refused states included, in as many
// transactions as it takes (10,000 tasks each); on error what was not written
// stays buffered. States Postgres refuses again stay aside, and Flush
// returns nil.
func (m *Materializer) Flush(ctx context.Context) error {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	// Batches a failed flush left come before the buffer.
	for _, retryRefused := range []bool{false, true} {
		if err := m.flushTaken(ctx, retryRefused, true); err != nil {
			return err
		}
	}
	return nil
}

// Lag is how many task states are buffered and not written yet, refused
// ones included.
func (m *Materializer) Lag() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.buf)) + m.pendingLen.Load() + m.refusedLen.Load()
}

// flushTaken writes the pending batches, taking what is buffered first when
// there are none (all of it when all, else holding young live states back),
// with the refused states when retryRefused or when their time has come.
// The caller holds flushMu.
func (m *Materializer) flushTaken(ctx context.Context, retryRefused, all bool) error {
	if len(m.pending) == 0 {
		retryRefused = retryRefused || !time.Now().Before(m.refusedNext)
		m.pending = m.take(retryRefused, all)
	}
	for len(m.pending) > 0 {
		if err := m.writeBatch(ctx, m.pending[0]); err != nil {
			return err
		}
		m.pending = m.pending[1:]
	}
	return nil
}

// take moves the buffered states into batches of up to maxBatch tasks.
// Unless all, the states of live tasks buffered less than liveHold ago (up
// to maxHeld of them, the oldest written first past that) stay in the
// buffer for a newer state to replace: only the states added since the last
// take, and the held ones whose time is up, are looked at, so a take costs
// what changed, not what is held. A refused state comes along when a newer
// state of its task does (folded into it) or when retryRefused. Over one
// batch, states are written in offset order, and a batch's events offset
// for a partition stops before the first record folded into a state of a
// later batch or one held back, so the view's offsets never pass a state it
// lacks.
func (m *Materializer) take(retryRefused, all bool) []*batch {
	// stop[p] is the first offset of p in the states left for later:
	// those held back, then those of the batches after the one being made.
	stop := make(map[int32]int64)
	m.mu.Lock()
	var taken []*buffered
	if all {
		taken = make([]*buffered, 0, len(m.buf))
		for _, b := range m.buf {
			b.held = false
			taken = append(taken, b)
		}
		m.buf = make(map[uuid.UUID]*buffered)
		clear(m.fresh)
		m.fresh, m.due, m.heldLen = m.fresh[:0], nil, 0
		clear(m.held)
	} else {
		taken = m.takeDue(time.Now())
		for p := range m.held {
			if f := m.front(p); f != nil {
				stop[p] = f.first
			}
		}
	}
	// Under mu, so Lag never misses the states between buf and pending.
	// Nothing is pending when a flush takes (flushTaken).
	m.pendingLen.Store(int64(len(taken)))
	m.mu.Unlock()
	retried := false
	if len(m.refused) > 0 {
		byTask := make(map[uuid.UUID]*buffered, len(taken))
		for _, b := range taken {
			byTask[b.Task.ID] = b
		}
		for id, r := range m.refused {
			if b, ok := byTask[id]; ok {
				b.fold(r)
			} else if retryRefused {
				taken = append(taken, r)
				m.pendingLen.Add(1)
				retried = true
			} else {
				continue
			}
			delete(m.refused, id)
		}
	}
	m.refusedLen.Store(int64(len(m.refused)))
	if retried {
		m.refusedNext = time.Now().Add(m.refusedBackoff.NextBackOff())
	}
	if len(taken) == 0 {
		return nil
	}
	if len(taken) > maxBatch {
		slices.SortFunc(taken, func(a, b *buffered) int { return cmp.Compare(a.Offset, b.Offset) })
	}
	out := make([]*batch, (len(taken)+maxBatch-1)/maxBatch)
	// Built from the last batch back.
	for i := len(out) - 1; i >= 0; i-- {
		chunk := taken[i*maxBatch : min((i+1)*maxBatch, len(taken))]
		out[i] = newBatch(chunk, maps.Clone(stop))
		for _, b := range chunk {
			stopAt(stop, b)
		}
	}
	return out
}

// takeDue removes from the buffer and returns what a take writes now: the
// held states a final one replaced, the states added since the last take
// that may not wait (final, rejected, or older than liveHold), the held
// states whose time is up and, past maxHeld, the oldest held ones. It holds
// back the rest of the new states. The caller holds mu.
func (m *Materializer) takeDue(now time.Time) []*buffered {
	taken := m.due
	m.due = nil
	for _, b := range m.fresh {
		if b.holdable() && now.Sub(b.added) < liveHold {
			b.held = true
			m.held[b.Partition] = append(m.held[b.Partition], b)
			m.heldLen++
			continue
		}
		taken = append(taken, b)
	}
	clear(m.fresh)
	m.fresh = m.fresh[:0]
	release := func(p int32) {
		b := m.front(p)
		b.held = false
		m.heldLen--
		m.popFront(p)
		taken = append(taken, b)
	}
	for p := range m.held {
		for f := m.front(p); f != nil && now.Sub(f.added) >= liveHold; f = m.front(p) {
			release(p)
		}
	}
	for m.heldLen > maxHeld {
		var (
			oldest int32
			first  *buffered
		)
		for p := range m.held {
			if f := m.front(p); f != nil && (first == nil || f.added.Before(first.added)) {
				oldest, first = p, f
			}
		}
		release(oldest)
	}
	for _, b := range taken {
		delete(m.buf, b.Task.ID)
	}
	return taken
}

// front is the oldest state held back of partition p, nil when none; it
// drops the stale entries before it. The caller holds mu.
func (m *Materializer) front(p int32) *buffered {
	for q := m.held[p]; len(q) > 0; q = m.held[p] {
		if q[0].held {
			return q[0]
		}
		m.popFront(p)
	}
	return nil
}

// popFront drops the first entry of partition p's held queue, forgetting
// the queue once it is empty. The caller holds mu.
func (m *Materializer) popFront(p int32) {
	q := m.held[p]
	q[0] = nil
	if len(q) == 1 {
		delete(m.held, p)
		return
	}
	m.held[p] = q[1:]
}

// stopAt lowers stop's offset for b's partition to b's first record.
func stopAt(stop map[int32]int64, b *buffered) {
	if s, ok := stop[b.Partition]; !ok || b.first < s {
		stop[b.Partition] = b.first
	}
}

// newBatch makes the batch writing states, whose partitions' events offsets
// stop at stop's when it has one.
func newBatch(states []*buffered, stop map[int32]int64) *batch {
	out := &batch{states: states, owners: make([]*buffered, 0, len(states)), stop: stop}
	for _, b := range states {
		if b.Task.Status != "" {
			out.owners = append(out.owners, b)
		}
	}
	return out
}

// writeBatch writes one batch: its rows and offsets in one transaction, or, when
// Postgres refuses a row, the rows in halves down to the refused ones and
// then the offsets, which stop before each refused state (see the package
// comment).
func (m *Materializer) writeBatch(ctx context.Context, b *batch) error {
	marks, reached := m.marks(b, nil)
	n, err := m.inTx(ctx, b.owners, marks)
	var refused map[*buffered]error
	if err != nil {
		if m.transient(ctx, err) {
			return err
		}
		if refused, err = m.isolate(ctx, b, err); err != nil {
			return err
		}
		marks, reached = m.marks(b, refused)
		if n, err = m.inTx(ctx, nil, marks); err != nil {
			return err
		}
	}
	m.written.Add(ctx, n)
	maps.Copy(m.reached, reached)
	for _, mk := range marks {
		// The view holds every state up to last only where nothing is
		// left for later below it.
		m.onFlushed(mk.partition, min(mk.last, mk.events-1))
	}
	m.setAside(ctx, b, refused)
	// Last, so a Lag of zero means the states are written and announced.
	m.pendingLen.Add(-int64(len(b.states)))
	return nil
}

// inTx writes rows and marks in a transaction of their own.
func (m *Materializer) inTx(ctx context.Context, states []*buffered, marks []mark) (int64, error) {
	var n int64
	err := pg.InTx(ctx, m.pool, func(tx pgx.Tx) error {
		var err error
		n, err = write(ctx, tx, m.partitions, states, marks)
		return err
	})
	return n, err
}

// transient reports whether err is Postgres (or the way to it) failing
// rather than a row: the whole batch is tried again. That is what the log
// consumers retry (kafka.IsTransient) and any other operator intervention
// (class 57) or rolled back transaction (class 40). ErrRekeyed is no row's
// fault either, and Run ends on it.
func (m *Materializer) transient(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrRekeyed) || kafka.IsTransient(err) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "57") || strings.HasPrefix(pgErr.Code, "40"))
}

// isolate writes the rows of b, which failed together with cause, in halves,
// each in a transaction of its own, down to the single rows Postgres
// refuses, and returns those with why. It fails as the write of nothing
// does, first (then the table or the offsets are at fault, not a row), and on
// a transient failure.
func (m *Materializer) isolate(ctx context.Context, b *batch, cause error) (map[*buffered]error, error) {
	if _, err := m.inTx(ctx, nil, nil); err != nil {
		return nil, fmt.Errorf("%w (a write of no task fails too)", err)
	}
	refused := make(map[*buffered]error)
	var split func(lo, hi int, cause error) error
	split = func(lo, hi int, cause error) error {
		if hi-lo <= 1 {
			if hi > lo {
				refused[b.owners[lo]] = cause
			}
			return nil
		}
		mid := (lo + hi) / 2
		for _, half := range [][2]int{{lo, mid}, {mid, hi}} {
			w, err := m.inTx(ctx, b.owners[half[0]:half[1]], nil)
			switch {
			case err == nil:
				m.written.Add(ctx, w)
			case m.transient(ctx, err):
				return err
			default:
				if err := split(half[0], half[1], err); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := split(0, len(b.owners), cause); err != nil {
		return nil, err
	}
	return refused, nil
}

// setAside keeps the refused states of a written batch for a later try,
// logging and counting each task's refusal once, and logs the states that
// land after a refusal.
func (m *Materializer) setAside(ctx context.Context, b *batch, refused map[*buffered]error) {
	landed := false
	for _, s := range b.owners {
		err, ok := refused[s]
		switch {
		case ok && !s.refused:
			s.refused = true
			m.refusals.Add(ctx, 1)
			m.log.ErrorContext(ctx, "the tasks view refused a task state; kept aside and tried again, the partition's view offset waits for it",
				"task_id", s.Task.ID, "partition", s.Partition, "offset", s.Offset, "error", err)
		case !ok && s.refused:
			landed = true
			m.log.InfoContext(ctx, "a refused task state is in the tasks view now", "task_id", s.Task.ID, "partition", s.Partition, "offset", s.Offset)
		}
		if ok {
			m.refused[s.Task.ID] = s
		}
	}
	if landed {
		m.refusedBackoff.Reset()
	}
	// A first refusal waits for Run's next try; a retry set the time of the
	// one after as it took the states.
	if len(refused) > 0 && !m.refusedNext.After(time.Now()) {
		m.refusedNext = time.Now().Add(m.refusedBackoff.NextBackOff())
	}
	m.refusedLen.Store(int64(len(m.refused)))
}

// marks are how far writing b takes each of its partitions when Postgres
// refused the states in refused: as far as its written states and the
// earlier batches' go (reached, to keep once written), but never past the
// first record folded into a refused state, this batch's or an earlier one's.
func (m *Materializer) marks(b *batch, refused map[*buffered]error) (marks []mark, reached map[int32]mark) {
	hold := make(map[int32]int64)
	holdAt := func(s *buffered) {
		if h, ok := hold[s.Partition]; !ok || s.first < h {
			hold[s.Partition] = s.first
		}
	}
	for _, s := range m.refused {
		holdAt(s)
	}
	for s := range refused {
		holdAt(s)
	}
	last := make(map[int32]int64)
	for _, s := range b.states {
		if _, ok := refused[s]; !ok {
			if l, ok := last[s.Partition]; !ok || s.Offset > l {
				last[s.Partition] = s.Offset
			}
		}
	}
	events := make(map[int32]int64, len(last))
	for p, l := range last {
		events[p] = l + 1
		if s, ok := b.stop[p]; ok {
			events[p] = min(events[p], s)
		}
	}
	commands := checkpoints(b, refused, events)
	held := make(map[int32]int64)
	for p, e := range events {
		if h, ok := hold[p]; ok && h < max(e, m.reached[p].events) {
			held[p] = h
		}
	}
	heldCommands := checkpoints(b, refused, held)
	reached = make(map[int32]mark, len(last))
	marks = make([]mark, 0, len(last))
	for p, l := range last {
		prev := m.reached[p]
		r := mark{partition: p, events: max(events[p], prev.events), commands: max(commands[p], prev.commands), last: max(l, prev.last)}
		reached[p] = r
		if h, ok := held[p]; ok {
			r.events, r.last, r.commands = h, min(r.last, h-1), heldCommands[p]
			if prev.events <= h {
				r.commands = max(r.commands, prev.commands)
			}
		}
		marks = append(marks, r)
	}
	// Offsets rows are locked in partition order, as two writers may share
	// partitions while ownership moves.
	slices.SortFunc(marks, func(a, b mark) int { return cmp.Compare(a.partition, b.partition) })
	return marks, reached
}

// checkpoints are, per partition of before, the commands checkpoint of the
// last state of b written below that events offset (checkpoints grow with
// offsets); 0 when none.
func checkpoints(b *batch, refused map[*buffered]error, before map[int32]int64) map[int32]int64 {
	out := make(map[int32]int64, len(before))
	if len(before) == 0 {
		return out
	}
	for _, s := range b.states {
		if e, ok := before[s.Partition]; ok && s.Offset < e {
			if _, no := refused[s]; !no {
				out[s.Partition] = max(out[s.Partition], s.CmdOffset)
			}
		}
	}
	return out
}
