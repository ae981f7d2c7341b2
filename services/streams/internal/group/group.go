// Package group hands a stream's records to the consumers of its groups and
// tracks them until they are settled. A group read is one transaction: due
// redeliveries first (ranges past their message timeout or nack delay, taken
// with SKIP LOCKED and reassigned, or moved to the dead-letter stream after
// max deliveries), then new records from the group's cursors, each partition
// run recorded as one pending range. Acks and nacks from concurrent calls
// are coalesced into one transaction. A blocked read waits on wake-ups
// (appends, nacks, the earliest due range, the stream's long-polling
// watcher) with a slow safety re-check, never a polling loop.
package group

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/libs/wake"
	"github.com/razorbill/flo/services/streams/internal/appender"
	"github.com/razorbill/flo/services/streams/internal/catalog"
	"github.com/razorbill/flo/services/streams/internal/logread"
	"github.com/razorbill/flo/services/streams/internal/pending"
	"github.com/razorbill/flo/services/streams/internal/record"
	"github.com/razorbill/flo/services/streams/internal/store"
)

// Limits and defaults of group reads.
const (
	DefaultCount          = 10
	MaxCount              = 10_000
	DefaultMessageTimeout = 5 * time.Minute
	MaxMessageTimeout     = 24 * time.Hour
	MaxBlock              = 10 * time.Minute
	MaxPendingLimit       = 10_000
	MaxNackDelay          = 7 * 24 * time.Hour
	// MaxReads caps the consumers' reads of one ReadMany.
	MaxReads = 1000
	// minDueWait keeps a blocked read from spinning on a due range that
	// another read holds locked.
	minDueWait = 20 * time.Millisecond
	// maxBatchReads bounds the reads one transaction serves, and
	// readTxTimeout how long it may take.
	maxBatchReads = 64
	readTxTimeout = 30 * time.Second
)

// Settling limits: calls queued beyond queueSize make callers wait, and one
// transaction settles at most batchSize calls.
const (
	queueSize = 1024
	batchSize = 256
)

// Headers set on dead-lettered records.
const (
	HeaderSourceID   = "flo-source-id"
	HeaderGroup      = "flo-group"
	HeaderDeliveries = "flo-deliveries"
	HeaderError      = "flo-error"
)

// Groups serves group reads, acks, nacks and pending lists.
type Groups struct {
	pool     *pgxpool.Pool
	catalog  *catalog.Catalog
	reader   *logread.Reader
	appender *appender.Appender
	hub      *wake.Hub
	settler  *coalesce.Batcher[settlement, int]
	log      *slog.Logger
	// rotate picks the partition a read starts taking new records from,
	// so concurrent consumers spread over partitions.
	rotate atomic.Uint32

	// reads holds, by group id, the reads waiting for a transaction of
	// their group while one runs.
	readMu sync.Mutex
	reads  map[int64]*readQueue
	// known holds the groups looked up by name.
	known knownGroups
	// quiet holds what the last look of each group found.
	quiet quietGroups
	// readTxs and readCalls count group read transactions and the reads
	// they served.
	readTxs, readCalls atomic.Int64

	delivered, acked, nacked, deadLettered metric.Int64Counter

	closeOnce sync.Once
	closing   chan struct{}
}

// New returns Groups; Run must be running for acks and nacks to be served.
func New(pool *pgxpool.Pool, cat *catalog.Catalog, reader *logread.Reader, app *appender.Appender, hub *wake.Hub, log *slog.Logger, meter metric.Meter) (*Groups, error) {
	g := &Groups{
		pool: pool, catalog: cat, reader: reader, appender: app, hub: hub, log: log,
		reads: map[int64]*readQueue{}, closing: make(chan struct{}),
	}
	for _, m := range []struct {
		c    *metric.Int64Counter
		name string
		desc string
	}{
		{&g.delivered, "flo.streams.records.delivered", "Records handed to group consumers, redeliveries included."},
		{&g.acked, "flo.streams.records.acked", "Records acked by group consumers."},
		{&g.nacked, "flo.streams.records.nacked", "Records nacked by group consumers."},
		{&g.deadLettered, "flo.streams.records.dead_lettered", "Records moved to a dead-letter stream after max deliveries."},
	} {
		c, err := meter.Int64Counter(m.name, metric.WithUnit("{record}"), metric.WithDescription(m.desc))
		if err != nil {
			return nil, fmt.Errorf("create metric: %w", err)
		}
		*m.c = c
	}
	g.settler = coalesce.New(queueSize, batchSize, g.settle)
	return g, nil
}

// Run settles coalesced acks and nacks until ctx ends.
func (g *Groups) Run(ctx context.Context) error { return g.settler.Run(ctx) }

// Close makes blocked reads return what they have (nothing) at once, so a
// graceful stop does not wait out their block times.
func (g *Groups) Close() { g.closeOnce.Do(func() { close(g.closing) }) }

// Closing is closed by Close.
func (g *Groups) Closing() <-chan struct{} { return g.closing }

// GroupKey is the hub key of a group's waiters.
func GroupKey(groupID int64) string { return "group/" + strconv.FormatInt(groupID, 10) }

// ReadRequest is one group read.
type ReadRequest struct {
	Key      store.GroupKey
	Consumer string
	Count    int
	// Block is how long to wait when nothing is ready; zero returns at once.
	Block time.Duration
	// MessageTimeout is how long the consumer may hold each record.
	MessageTimeout time.Duration
}

func (req *ReadRequest) validate() error {
	if err := catalog.ValidateGroupKey(req.Key); err != nil {
		return err
	}
	if err := text.WorkerID("consumer", req.Consumer); err != nil {
		return err
	}
	switch {
	case req.Count < 0:
		return fault.Invalidf("count must not be negative, got %d", req.Count)
	case req.Count == 0:
		req.Count = DefaultCount
	}
	req.Count = min(req.Count, MaxCount)
	if req.Block < 0 {
		return fault.Invalidf("block_ms must not be negative")
	}
	req.Block = min(req.Block, MaxBlock)
	switch {
	case req.MessageTimeout < 0:
		return fault.Invalidf("message_timeout_ms must not be negative")
	case req.MessageTimeout == 0:
		req.MessageTimeout = DefaultMessageTimeout
	}
	req.MessageTimeout = min(req.MessageTimeout, MaxMessageTimeout)
	return nil
}

// Read hands up to req.Count records to req.Consumer, waiting up to
// req.Block when none is ready. It returns no records and no error when the
// wait ran out.
func (g *Groups) Read(ctx context.Context, req ReadRequest) ([]record.Record, error) {
	recs, err := g.ReadMany(ctx, req.Key, []ReadRequest{req}, req.Block)
	if err != nil {
		return nil, err
	}
	return recs[0], nil
}

// ReadMany reads for several consumers of the group key (each request's
// Key and Block are set from the arguments) as one waiter: it returns, in
// the order of reqs, what each read got as soon as any got records, or
// nothing once block passes. Each read is a group read of its consumer,
// with Read's validation and caps; a consumer may be named more than once.
func (g *Groups) ReadMany(ctx context.Context, key store.GroupKey, reqs []ReadRequest, block time.Duration) ([][]record.Record, error) {
	if len(reqs) == 0 || len(reqs) > MaxReads {
		return nil, fault.Invalidf("a read names 1 to %d consumers, got %d", MaxReads, len(reqs))
	}
	for i := range reqs {
		reqs[i].Key, reqs[i].Block = key, block
		if err := reqs[i].validate(); err != nil {
			return nil, err
		}
	}
	grp, err := g.lookup(ctx, key)
	if err != nil {
		return nil, err
	}
	recs, err := g.read(ctx, grp, reqs)
	if errors.Is(err, errGroupGone) {
		// Deleted since it was looked up, and maybe created again.
		g.forget(key)
		g.quiet.drop(grp.Group.ID)
		if grp, err = g.catalog.GetGroup(ctx, key); err != nil {
			return nil, err
		}
		recs, err = g.read(ctx, grp, reqs)
		if errors.Is(err, errGroupGone) {
			return nil, catalog.GroupNotFound(key)
		}
	}
	return recs, err
}

// read is ReadMany of the group grp, reqs validated. A blocked read waits
// for a wake-up of its group's or its stream's key, or for the group's
// earliest pending range to come due for one of its consumers, and then
// looks again. The hub's safety tick probes one waiter per key instead of
// waking them all: a probed read that finds records (or the group gone)
// wakes the group's other reads, since they all missed the same wake-up. A
// look while the group's last look still holds (see quietGroups) costs no
// transaction.
func (g *Groups) read(ctx context.Context, grp store.GroupOf, reqs []ReadRequest) ([][]record.Record, error) {
	block := reqs[0].Block
	if block <= 0 {
		recs, _, err := g.look(ctx, grp, reqs, false)
		return recs, err
	}
	topic := grp.Stream.Topic()
	keys := []string{GroupKey(grp.Group.ID), topic}
	// Subscribe before looking, so whatever arrives after the look wakes us.
	w := g.hub.Subscribe(keys)
	defer g.hub.Unsubscribe(w)
	var (
		deadline <-chan time.Time
		release  func()
	)
	for {
		probed := w.Probed()
		recs, due, err := g.look(ctx, grp, reqs, probed)
		got := slices.ContainsFunc(recs, func(r []record.Record) bool { return len(r) > 0 })
		if probed && (got || errors.Is(err, errGroupGone)) {
			g.hub.Wake(keys[0])
		}
		if err != nil || got {
			return recs, err
		}
		if release == nil {
			release = g.reader.Watch(topic, grp.Stream.Partitions)
			defer release()
			t := time.NewTimer(block)
			defer t.Stop()
			deadline = t.C
		}
		wait := MaxBlock
		now := time.Now()
		for _, req := range reqs {
			if at, ok := due.For(req.Consumer, now); ok {
				wait = min(wait, max(at.Sub(now), minDueWait))
			}
		}
		dueTimer := time.NewTimer(wait)
		select {
		case <-w.C():
		case <-dueTimer.C:
		case <-deadline:
			dueTimer.Stop()
			return recs, nil
		case <-g.closing:
			dueTimer.Stop()
			return recs, nil
		case <-ctx.Done():
			dueTimer.Stop()
			return nil, ctx.Err()
		}
		dueTimer.Stop()
	}
}

// ReadTransactions is how many group read transactions ran and how many
// reads they served in all.
func (g *Groups) ReadTransactions() (txs, reads int64) {
	return g.readTxs.Load(), g.readCalls.Load()
}

// readBatch runs one group read transaction for calls, reads of one group
// waiting together: due redeliveries first, then new records from the
// group's cursors, handed to the calls in turn. It sets each call's records;
// an error is every call's.
func (g *Groups) readBatch(ctx context.Context, grp store.GroupOf, calls []*readCall) error {
	var dead int
	g.readTxs.Add(1)
	g.readCalls.Add(int64(len(calls)))
	err := pg.InBatchTx(ctx, g.pool, func(tx *pg.BatchTx) error {
		sh := newShare(calls)
		now := time.Now()
		if grp.Group.Mode == store.ModeKeyShared {
			var err error
			dead, err = g.readKeys(ctx, tx, grp, sh, now)
			return err
		}
		exclusive := grp.Group.Mode == store.ModeExclusive
		due, cursors, lease, err := store.LockForRead(ctx, tx, grp.Group.ID, now, sh.wanted(), exclusive)
		if err != nil {
			return err
		}
		if cursors == nil {
			return errGroupGone
		}
		var (
			ch      store.Changes
			expired []pending.Range
		)
		if exclusive {
			sh = newShare(leaseHolder(lease, calls, now, &ch))
		}
		for _, r := range due {
			if r.Deliveries >= int(grp.Group.MaxDeliveries) {
				expired = append(expired, r)
				continue
			}
			if sh.wanted() == 0 {
				continue
			}
			if err := g.redeliver(ctx, grp, r, sh, now, &ch); err != nil {
				return err
			}
		}
		if len(expired) > 0 {
			if dead, err = g.deadLetter(ctx, grp, expired, &ch); err != nil {
				return err
			}
		}
		if sh.wanted() > 0 {
			if err := g.takeNew(ctx, grp, cursors, sh, now, &ch); err != nil {
				return err
			}
		}
		return store.Commit(ctx, tx, ch)
	})
	if err != nil {
		return err
	}
	n := 0
	for _, c := range calls {
		n += len(c.recs)
	}
	if n > 0 || dead > 0 {
		g.quiet.changed(grp.Group.ID)
	}
	g.delivered.Add(ctx, int64(n))
	if dead > 0 {
		g.deadLettered.Add(ctx, int64(dead))
	}
	return nil
}

// leaseHolder returns the calls of the consumer that holds an exclusive
// group: the lease's owner while it lasts, otherwise the first call's
// consumer, which takes the lease over. The holder's reads renew the lease
// for their message timeout plus block time, so a consumer long-polling or
// working on its records keeps the group; one silent for longer loses it,
// and its unacked records, due by then, go to the next holder as
// redeliveries. The other calls get nothing.
func leaseHolder(lease store.Lease, calls []*readCall, now time.Time, ch *store.Changes) []*readCall {
	owner := lease.Owner
	if !now.Before(lease.Until) {
		owner = calls[0].req.Consumer
	}
	var (
		held []*readCall
		hold time.Duration
	)
	for _, c := range calls {
		if c.req.Consumer != owner {
			c.recs = c.recs[:0]
			continue
		}
		held = append(held, c)
		hold = max(hold, c.req.MessageTimeout+c.req.Block)
	}
	if len(held) > 0 {
		ch.Lease = &store.Lease{GroupID: lease.GroupID, Owner: owner, Until: now.Add(hold)}
	}
	return held
}

// share hands the records of one read transaction to its calls in turn:
// each call takes records until it has its count or has spent its response
// budget. A call with budget left takes one more record however large, so
// every read that wants records gets at least one when there is one.
type share struct {
	calls  []*readCall
	budget []int
	cur    int
}

func newShare(calls []*readCall) *share {
	sh := &share{calls: calls, budget: make([]int, len(calls))}
	for i, c := range calls {
		c.recs = c.recs[:0]
		sh.budget[i] = record.MaxResponseBytes
	}
	return sh
}

// next is the index of the call that takes the next record, -1 when every
// call has what it wants.
func (sh *share) next() int {
	for ; sh.cur < len(sh.calls); sh.cur++ {
		if len(sh.calls[sh.cur].recs) < sh.calls[sh.cur].req.Count && sh.budget[sh.cur] > 0 {
			return sh.cur
		}
	}
	return -1
}

// wanted is how many more records the calls take at most.
func (sh *share) wanted() int {
	n := 0
	for i := sh.cur; i < len(sh.calls); i++ {
		if sh.budget[i] > 0 {
			n += sh.calls[i].req.Count - len(sh.calls[i].recs)
		}
	}
	return n
}

// give hands r, delivered for the deliveries-th time, to call i.
func (sh *share) give(i int, r *kgo.Record, deliveries int) {
	sh.budget[i] -= record.Size(r)
	lr := record.FromLog(r)
	lr.DeliveryCount = deliveries
	sh.calls[i].recs = append(sh.calls[i].recs, lr)
}

// claim marks the records a call took as pending for its consumer.
func claim(r *pending.Range, req ReadRequest, deliveries int, now time.Time) {
	r.Consumer, r.Deliveries, r.DeliveredAt, r.RedeliverAt = req.Consumer, deliveries, now, now.Add(req.MessageTimeout)
}

// redeliver hands what the calls still want of a due range's records to
// them, each call's share becoming a range of its own. Records the log no
// longer holds are settled.
func (g *Groups) redeliver(ctx context.Context, grp store.GroupOf, r pending.Range, sh *share, now time.Time, ch *store.Changes) error {
	open := r.Open()
	open = open[:min(len(open), sh.wanted())]
	recs, err := g.fetchOffsets(ctx, grp.Stream.Topic(), r.Partition, open)
	if err != nil {
		return err
	}
	// taker[off] is the call (index+1) that takes the record at off.
	taker := make(map[int64]int, len(open))
	for _, off := range open {
		rec := recs[off]
		if rec == nil {
			r.Settle(off) // removed by retention
			continue
		}
		i := sh.next()
		if i < 0 {
			break
		}
		sh.give(i, rec, r.Deliveries+1)
		taker[off] = i + 1
	}
	pieces := r.Split(func(off int64) int { return taker[off] })
	for k := range pieces {
		if o := pieces[k].Owner; o > 0 {
			claim(&pieces[k].Range, sh.calls[o-1].req, r.Deliveries+1, now)
		}
	}
	replace(ch, r, pieces)
	return nil
}

// replace records the write that turns range r into pieces: an in-place
// update when one piece spans it unchanged in bounds, otherwise a delete and
// inserts.
func replace(ch *store.Changes, r pending.Range, pieces []pending.Piece) {
	if len(pieces) == 1 && pieces[0].Range.First == r.First && pieces[0].Range.Last == r.Last {
		p := pieces[0].Range
		p.ID = r.ID
		ch.Update = append(ch.Update, p)
		return
	}
	ch.Delete = append(ch.Delete, r.ID)
	for _, p := range pieces {
		ch.Insert = append(ch.Insert, p.Range)
	}
}

// fetchOffsets reads the records at offsets (ascending) of one partition;
// offsets the log no longer holds are missing from the result.
func (g *Groups) fetchOffsets(ctx context.Context, topic string, partition int32, offsets []int64) (map[int64]*kgo.Record, error) {
	out := make(map[int64]*kgo.Record, len(offsets))
	if len(offsets) == 0 {
		return out, nil
	}
	last := offsets[len(offsets)-1]
	next := offsets[0]
	for next <= last {
		gots, err := g.reader.Read(ctx, topic, []logread.Want{{Partition: partition, From: next, Max: int(last - next + 1)}})
		if err != nil {
			return nil, err
		}
		got := gots[0]
		if len(got.Records) == 0 {
			break
		}
		for _, r := range got.Records {
			if r.Offset <= last {
				out[r.Offset] = r
			}
		}
		next = got.Next
	}
	return out, nil
}

// takeNew hands the calls records no consumer of the group has seen, from
// cursors (locked), starting at a rotating partition: first what the read
// cache holds, then, if that is not enough, one broker fetch for the
// partitions that ran short. Each call's run of one partition becomes one
// pending range.
func (g *Groups) takeNew(ctx context.Context, grp store.GroupOf, cursors []int64, sh *share, now time.Time, ch *store.Changes) error {
	topic := grp.Stream.Topic()
	want := sh.wanted()
	n := len(cursors)
	first := int(g.rotate.Add(1) % uint32(n))
	order := make([]int32, n)
	for i := range order {
		order[i] = int32((first + i) % n)
	}

	cached := make([][]*kgo.Record, n)
	have := 0
	for _, p := range order {
		if have >= want {
			break
		}
		cached[p], _ = g.reader.Cache().Get(nil, topic, p, cursors[p], want-have)
		have += len(cached[p])
	}
	from := make([]int64, n)
	copy(from, cursors)
	if have < want {
		var wants []logread.Want
		for _, p := range order {
			next := cursors[p]
			if len(cached[p]) > 0 {
				next = cached[p][len(cached[p])-1].Offset + 1
			}
			wants = append(wants, logread.Want{Partition: p, From: next, Max: want - len(cached[p])})
		}
		gots, err := g.reader.Read(ctx, topic, wants)
		if err != nil {
			return err
		}
		for _, got := range gots {
			p := got.Partition
			if len(cached[p]) == 0 && got.From > from[p] {
				from[p] = got.From // retention removed records before it
			}
			cached[p] = append(cached[p], got.Records...)
		}
	}

	for _, p := range order {
		next := from[p]
		run := newRun(grp.Group.ID, p)
		for _, r := range cached[p] {
			i := sh.next()
			if i < 0 {
				break
			}
			if i != run.call {
				run.close(sh, now, ch)
				run.call = i
			}
			sh.give(i, r, 1)
			run.add(r)
			next = r.Offset + 1
		}
		run.close(sh, now, ch)
		if next != cursors[p] {
			ch.Cursors = append(ch.Cursors, store.Cursor{GroupID: grp.Group.ID, Partition: p, Next: next})
		}
		if sh.next() < 0 {
			break
		}
	}
	return nil
}

// run gathers the new records of one partition that one call takes, which
// become one pending range.
type run struct {
	groupID   int64
	partition int32
	call      int
	offsets   []int64
	stamps    []int64
}

func newRun(groupID int64, partition int32) *run {
	return &run{groupID: groupID, partition: partition, call: -1}
}

func (r *run) add(rec *kgo.Record) {
	r.offsets = append(r.offsets, rec.Offset)
	r.stamps = append(r.stamps, rec.Timestamp.UnixMilli())
}

// close writes the run as a range of its call's consumer and starts anew.
func (r *run) close(sh *share, now time.Time, ch *store.Changes) {
	if len(r.offsets) > 0 {
		rg := pending.New(r.groupID, r.partition, r.offsets, r.stamps)
		claim(&rg, sh.calls[r.call].req, 1, now)
		ch.Insert = append(ch.Insert, rg)
	}
	r.offsets, r.stamps = nil, nil
}

// deadLetter appends the unsettled records of ranges past max deliveries to
// the stream's dead-letter stream and removes the ranges. It runs inside
// the read's transaction: if the transaction fails after the append, the
// records are dead-lettered again by a later read (at least once).
func (g *Groups) deadLetter(ctx context.Context, grp store.GroupOf, ranges []pending.Range, ch *store.Changes) (int, error) {
	var out []*kgo.Record
	for _, r := range ranges {
		recs, err := g.fetchOffsets(ctx, grp.Stream.Topic(), r.Partition, r.Open())
		if err != nil {
			return 0, err
		}
		for _, off := range r.Open() {
			rec := recs[off]
			if rec == nil {
				continue // removed by retention
			}
			dl := &kgo.Record{Key: rec.Key, Value: rec.Value, Partition: -1}
			dl.Headers = append(make([]kgo.RecordHeader, 0, len(rec.Headers)+4), rec.Headers...)
			dl.Headers = append(dl.Headers,
				kgo.RecordHeader{Key: HeaderSourceID, Value: []byte(record.IDOf(rec).String())},
				kgo.RecordHeader{Key: HeaderGroup, Value: []byte(grp.Group.Name)},
				kgo.RecordHeader{Key: HeaderDeliveries, Value: []byte(strconv.Itoa(r.Deliveries))},
				kgo.RecordHeader{Key: HeaderError, Value: []byte(r.LastError)},
			)
			out = append(out, dl)
		}
		ch.Delete = append(ch.Delete, r.ID)
	}
	if len(out) == 0 {
		return 0, nil
	}
	dlq, err := g.catalog.DeadLetters(ctx, grp.Stream)
	if err != nil {
		return 0, fmt.Errorf("dead-letter stream of %s: %w", grp.Stream.Name, err)
	}
	for _, r := range out {
		r.Topic = dlq.Topic()
	}
	if _, err := g.appender.Produce(ctx, dlq, out); err != nil {
		return 0, err
	}
	return len(out), nil
}

// isRetryable reports whether a settlement transaction lost a race it can
// simply run again.
func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}
