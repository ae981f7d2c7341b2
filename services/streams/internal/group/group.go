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
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/pg"
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
	DefaultPendingLimit   = 100
	MaxPendingLimit       = 10_000
	MaxNackDelay          = 7 * 24 * time.Hour
	// minDueWait keeps a blocked read from spinning on a due range that
	// another read holds locked.
	minDueWait = 20 * time.Millisecond
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

	delivered, acked, nacked, deadLettered metric.Int64Counter

	closeOnce sync.Once
	closing   chan struct{}
}

// New returns Groups; Run must be running for acks and nacks to be served.
func New(pool *pgxpool.Pool, cat *catalog.Catalog, reader *logread.Reader, app *appender.Appender, hub *wake.Hub, log *slog.Logger, meter metric.Meter) (*Groups, error) {
	g := &Groups{pool: pool, catalog: cat, reader: reader, appender: app, hub: hub, log: log, closing: make(chan struct{})}
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
		c, err := meter.Int64Counter(m.name, metric.WithDescription(m.desc))
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
	if req.Consumer == "" {
		return fault.Invalidf("consumer is required")
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
	if err := req.validate(); err != nil {
		return nil, err
	}
	grp, err := g.catalog.GetGroup(ctx, req.Key)
	if err != nil {
		return nil, err
	}
	topic := grp.Stream.Topic()
	var w *wake.Waiter
	if req.Block > 0 {
		// Subscribe before looking, so whatever arrives after the look
		// wakes us.
		w = g.hub.Subscribe([]string{GroupKey(grp.Group.ID), topic})
		defer g.hub.Unsubscribe(w)
	}
	var (
		deadline <-chan time.Time
		release  func()
	)
	for {
		recs, err := g.readOnce(ctx, grp, req)
		if err != nil || len(recs) > 0 || req.Block <= 0 {
			return recs, err
		}
		due, ok, err := store.NextDue(ctx, g.pool, grp.Group.ID)
		if err != nil {
			return nil, err
		}
		if release == nil {
			release = g.reader.Watch(topic, grp.Stream.Partitions)
			defer release()
			t := time.NewTimer(req.Block)
			defer t.Stop()
			deadline = t.C
		}
		// The hub's safety tick wakes us now and then too.
		wait := MaxBlock
		if ok {
			wait = max(time.Until(due), minDueWait)
		}
		dueTimer := time.NewTimer(wait)
		select {
		case <-w.C():
		case <-dueTimer.C:
		case <-deadline:
			dueTimer.Stop()
			return nil, nil
		case <-g.closing:
			dueTimer.Stop()
			return nil, nil
		case <-ctx.Done():
			dueTimer.Stop()
			return nil, ctx.Err()
		}
		dueTimer.Stop()
	}
}

// readOnce runs one group read transaction.
func (g *Groups) readOnce(ctx context.Context, grp store.GroupOf, req ReadRequest) ([]record.Record, error) {
	var (
		out  []record.Record
		dead int
	)
	err := pg.InTx(ctx, g.pool, func(tx pgx.Tx) error {
		out, dead = out[:0], 0
		budget := record.MaxResponseBytes
		now := time.Now()
		var ch store.Changes
		due, err := store.LockDue(ctx, tx, grp.Group.ID, now, req.Count)
		if err != nil {
			return err
		}
		var expired []pending.Range
		for _, r := range due {
			if r.Deliveries >= int(grp.Group.MaxDeliveries) {
				expired = append(expired, r)
				continue
			}
			if len(out) >= req.Count || budget <= 0 {
				continue
			}
			recs, err := g.redeliver(ctx, grp, r, req, req.Count-len(out), &budget, now, &ch)
			if err != nil {
				return err
			}
			out = append(out, recs...)
		}
		if len(expired) > 0 {
			if dead, err = g.deadLetter(ctx, grp, expired, &ch); err != nil {
				return err
			}
		}
		if len(out) < req.Count && budget > 0 {
			recs, err := g.takeNew(ctx, tx, grp, req, req.Count-len(out), &budget, now, &ch)
			if err != nil {
				return err
			}
			out = append(out, recs...)
		}
		return store.Apply(ctx, tx, ch)
	})
	if err != nil {
		return nil, err
	}
	g.delivered.Add(ctx, int64(len(out)))
	if dead > 0 {
		g.deadLettered.Add(ctx, int64(dead))
	}
	return out, nil
}

// redeliver hands up to what the read still wants of a due range's records
// to the reader's consumer. Records the log no longer holds are settled.
func (g *Groups) redeliver(ctx context.Context, grp store.GroupOf, r pending.Range, req ReadRequest, want int, budget *int, now time.Time, ch *store.Changes) ([]record.Record, error) {
	open := r.Open()
	if len(open) > want {
		open = open[:want]
	}
	recs, err := g.fetchOffsets(ctx, grp.Stream.Topic(), r.Partition, open)
	if err != nil {
		return nil, err
	}
	taken := map[int64]bool{}
	var out []record.Record
	for _, off := range open {
		rec := recs[off]
		if rec == nil {
			r.Settle(off) // removed by retention
			continue
		}
		if !spend(budget, rec) {
			break
		}
		taken[off] = true
		lr := record.FromLog(rec)
		lr.DeliveryCount = r.Deliveries + 1
		out = append(out, lr)
	}
	pieces := r.Split(func(off int64) int {
		if taken[off] {
			return 1
		}
		return 0
	})
	for i := range pieces {
		if pieces[i].Owner == 1 {
			p := &pieces[i].Range
			p.Consumer = req.Consumer
			p.Deliveries = r.Deliveries + 1
			p.DeliveredAt = now
			p.RedeliverAt = now.Add(req.MessageTimeout)
		}
	}
	replace(ch, r, pieces)
	return out, nil
}

// spend takes r's size from the response budget; it refuses only once the
// budget is used up, so a read returns at least one record however large.
func spend(budget *int, r *kgo.Record) bool {
	if *budget <= 0 {
		return false
	}
	*budget -= record.Size(r)
	return true
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

// takeNew hands up to want records no consumer of the group has seen,
// starting at a rotating partition: first what the read cache holds, then,
// if that is not enough, one broker fetch for the partitions that ran short.
func (g *Groups) takeNew(ctx context.Context, tx pgx.Tx, grp store.GroupOf, req ReadRequest, want int, budget *int, now time.Time, ch *store.Changes) ([]record.Record, error) {
	cursors, err := store.LockCursors(ctx, tx, grp.Group.ID)
	if err != nil {
		return nil, err
	}
	if cursors == nil {
		return nil, catalog.GroupNotFound(req.Key)
	}
	topic := grp.Stream.Topic()
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
			return nil, err
		}
		for _, got := range gots {
			p := got.Partition
			if len(cached[p]) == 0 && got.From > from[p] {
				from[p] = got.From // retention removed records before it
			}
			cached[p] = append(cached[p], got.Records...)
		}
	}

	var out []record.Record
	for _, p := range order {
		recs := cached[p]
		if len(out)+len(recs) > want {
			recs = recs[:want-len(out)]
		}
		for i, r := range recs {
			if !spend(budget, r) {
				recs = recs[:i]
				want = len(out) + i
				break
			}
		}
		next := from[p]
		if len(recs) > 0 {
			offsets := make([]int64, len(recs))
			stamps := make([]int64, len(recs))
			for i, r := range recs {
				offsets[i], stamps[i] = r.Offset, r.Timestamp.UnixMilli()
				lr := record.FromLog(r)
				lr.DeliveryCount = 1
				out = append(out, lr)
			}
			rg := pending.New(grp.Group.ID, p, offsets, stamps)
			rg.Consumer, rg.Deliveries, rg.DeliveredAt, rg.RedeliverAt = req.Consumer, 1, now, now.Add(req.MessageTimeout)
			ch.Insert = append(ch.Insert, rg)
			next = offsets[len(offsets)-1] + 1
		}
		if next != cursors[p] {
			ch.Cursors = append(ch.Cursors, store.Cursor{GroupID: grp.Group.ID, Partition: p, Next: next})
		}
		if len(out) >= want {
			break
		}
	}
	return out, nil
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
