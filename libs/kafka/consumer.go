package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/telemetry"

	"github.com/razorbill/flo/libs/config"
)

// BatchHandler handles the records one poll returned for one partition, in
// offset order. Consumers and tails run it behind one chain of middleware: a
// panic becomes an error, the call runs in a span continuing the records'
// traces, and a transient error (IsTransient) runs the same batch again with
// backoff, so handlers must be idempotent; they should return promptly once
// ctx is done. Any other error isolates the failure: the batch runs again on
// its own (Isolated), then record by record, and a record that fails alone
// is dead-lettered by a Consumer and skipped by a Tail. A handler that knows
// which records are bad returns Poison errors for them instead. A Consumer
// may call its handler concurrently for different partitions; calls for one
// partition never overlap. The records' memory is reused once the handler
// returns (Consumer and Tail recycle it into franz-go's fetch pool): a
// handler copies whatever it keeps of a record's key, value or headers
// (decoding with the generated code or proto.Unmarshal copies).
type BatchHandler func(ctx context.Context, records []*kgo.Record) error

const (
	// maxPollRecords bounds the records of one poll.
	maxPollRecords = 10_000
	// commitEvery spaces a member's commits: at low rates a poll brings a
	// record or two, and a commit after each cost the broker a request,
	// and a write, per record. Handled offsets wait at most this long; a
	// crash redelivers what they cover, which idempotent handlers absorb,
	// and a revocation or a stop commits them at once.
	commitEvery = 500 * time.Millisecond
	// commitTimeout bounds the final commits made while shutting down.
	commitTimeout = 10 * time.Second
)

// Consumer is a consumer-group member that commits a partition's offsets only
// after its handler returned nil for the records before them.
type Consumer struct {
	cl     *kgo.Client
	conn   config.Kafka
	group  string
	topics []string
	h      *isolator
	log    *slog.Logger

	// takeOver is set by TakeOverTaskOutcomes; handover says what Run
	// waits for before its group joins, nil once it joined.
	takeOver bool
	handover atomic.Pointer[string]

	mu sync.Mutex
	// pending holds handled offsets not committed yet: waiting for the
	// next commit (commitEvery) or kept after a failed one. They are
	// committed when partitions are revoked, too.
	pending map[string]map[int32]kgo.EpochOffset
	// committed is when Run last committed.
	committed time.Time

	lagMu sync.Mutex
	// lag is, per partition this member owns, how many records the last
	// fetch said were beyond those handled.
	lag map[string]map[int32]int64
}

// NewConsumer returns a member of group, which joins once Run starts,
// consuming topics from their start when the group has no committed offsets
// there. Polls are handled partition by partition through h, partitions in
// parallel; the poll's offsets are committed after every handled partition
// succeeded, at most every commitEvery (those of the polls between ride the
// next commit), and the group cannot rebalance during a poll's handling
// (BlockRebalanceOnPoll); a revocation commits what was handled, so a
// partition moves to another member only with its progress committed. A
// record h cannot handle even alone goes to its topic's dead-letter topic
// (DeadLetterTopic, created with one partition before its first record) with
// headers saying why and where it came from, and is counted as
// flo.consumer.dead_lettered by topic and group; its offset is committed
// only once the dead-letter topic has it. opts are passed to NewClient after
// the group options.
func NewConsumer(conn config.Kafka, group string, topics []string, h BatchHandler, log *slog.Logger, opts ...kgo.Opt) (*Consumer, error) {
	if len(topics) == 0 {
		return nil, fmt.Errorf("new consumer %s: no topics", group)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Consumer{
		conn: conn, group: group, topics: slices.Clone(topics), log: log.With("group", group),
		pending: map[string]map[int32]kgo.EpochOffset{}, lag: map[string]map[int32]int64{},
	}
	groupOpts := []kgo.Opt{
		// The topics are added by Run: franz-go joins the group as soon
		// as it knows them.
		kgo.ConsumerGroup(group),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers take offsets too; seeing them lets the
		// committed offset, and the lag, reach the end of a partition whose
		// last record is one.
		kgo.KeepControlRecords(),
		// A member that dies without leaving holds its partitions until its
		// session times out; Kafka's 45 s default would stall a restarted
		// replica's partitions that long.
		kgo.SessionTimeout(10 * time.Second),
		kgo.HeartbeatInterval(time.Second),
		PooledFetches(),
	}
	cl, err := NewClient(conn, append(groupOpts, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("new consumer %s: %w", group, err)
	}
	dl, err := NewDeadLetterer(cl, group, c.log)
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("new consumer %s: %w", group, err)
	}
	c.cl = cl
	c.h = &isolator{h: newChain(h, c.log), reject: dl.DeadLetter, log: c.log}
	return c, nil
}

// Run joins the group, then polls and handles records until ctx ends, commits
// what was handled and closes the client (leaving the group). It returns nil
// on shutdown.
// Handled offsets are committed at most every commitEvery, and no later
// than that once polls stop bringing records.
// While it runs, the lag of the partitions this member owns is reported
// through the global meter provider as flo.consumer.lag, by topic and group.
func (c *Consumer) Run(ctx context.Context) error {
	defer c.cl.Close()
	if reg, err := c.registerLag(); err != nil {
		c.log.WarnContext(ctx, "consumer lag not reported", "error", err)
	} else {
		defer func() { _ = reg.Unregister() }()
	}
	if c.takeOver {
		if err := c.takeOverTaskOutcomes(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("consumer %s: %w", c.group, err)
		}
	}
	c.cl.AddConsumeTopics(c.topics...)
	for {
		pollCtx, cancel := ctx, context.CancelFunc(func() {})
		if due, ok := c.commitDue(); ok {
			// Wait for records no longer than the pending commit may.
			pollCtx, cancel = context.WithDeadline(ctx, due)
		}
		fetches := c.cl.PollRecords(pollCtx, maxPollRecords)
		cancel()
		if ctx.Err() != nil || fetches.IsClientClosed() {
			c.commit(ctx, nil, true)
			c.cl.AllowRebalance()
			return nil
		}
		if pollCtx.Err() != nil && fetches.NumRecords() == 0 {
			c.commit(ctx, nil, true)
			c.cl.AllowRebalance()
			continue
		}
		logFetchErrors(ctx, c.log, fetches)

		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			done = map[string]map[int32]kgo.EpochOffset{}
		)
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			wg.Go(func() {
				if data := withoutControl(p.Records); len(data) > 0 && !c.h.handle(ctx, data) {
					return
				}
				// The last record may be a transaction marker: the handled
				// position, and so the lag, counts it.
				last := p.Records[len(p.Records)-1]
				c.setLag(p.Topic, p.Partition, p.HighWatermark-(last.Offset+1))
				mu.Lock()
				defer mu.Unlock()
				if done[p.Topic] == nil {
					done[p.Topic] = map[int32]kgo.EpochOffset{}
				}
				done[p.Topic][p.Partition] = kgo.EpochOffset{Epoch: last.LeaderEpoch, Offset: last.Offset + 1}
			})
		})
		wg.Wait()
		// The handlers are done with the records: their buffers go back
		// to the pool.
		recycle(fetches)
		c.commit(ctx, done, false)
		c.cl.AllowRebalance()
	}
}

// commit adds the handled offsets to the pending ones and commits them all
// when now, or when commitEvery has passed since the last commit. A failed
// commit is logged and kept for the next try; the records after the last
// successful commit may be delivered again, which idempotent handlers
// absorb.
func (c *Consumer) commit(ctx context.Context, handled map[string]map[int32]kgo.EpochOffset, now bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range handled {
		if c.pending[t] == nil {
			c.pending[t] = map[int32]kgo.EpochOffset{}
		}
		for p, o := range ps {
			c.pending[t][p] = o
		}
	}
	if now || time.Since(c.committed) >= commitEvery {
		c.committed = time.Now()
		c.commitPendingLocked(ctx, nil)
	}
}

// commitDue is when the pending offsets are to be committed; ok is false
// when none are pending.
func (c *Consumer) commitDue() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ps := range c.pending {
		if len(ps) > 0 {
			return c.committed.Add(commitEvery), true
		}
	}
	return time.Time{}, false
}

// commitPendingLocked commits the pending offsets (only of the given
// partitions when only is non-nil) and forgets those the broker accepted.
func (c *Consumer) commitPendingLocked(ctx context.Context, only map[string][]int32) {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	for t, ps := range c.pending {
		for p, o := range ps {
			if only != nil && !containsPartition(only, t, p) {
				continue
			}
			if offsets[t] == nil {
				offsets[t] = map[int32]kgo.EpochOffset{}
			}
			offsets[t][p] = o
		}
	}
	if len(offsets) == 0 {
		return
	}
	// Handled work is committed even while shutting down.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	c.cl.CommitOffsetsSync(cctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			c.log.WarnContext(ctx, "commit offsets failed; records may be redelivered", "error", err)
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
					c.log.WarnContext(ctx, "commit offset failed; records may be redelivered", "topic", t.Topic, "partition", p.Partition, "error", perr)
					continue
				}
				if c.pending[t.Topic][p.Partition] == offsets[t.Topic][p.Partition] {
					delete(c.pending[t.Topic], p.Partition)
				}
			}
		}
	})
}

// revoked commits handled offsets of partitions leaving this member, so the
// next owner starts after them.
func (c *Consumer) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commitPendingLocked(ctx, revoked)
	c.forgetLocked(revoked)
}

// lost forgets the pending offsets of partitions taken away without a chance
// to commit; the new owner handles those records again.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(lost)
}

func (c *Consumer) forgetLocked(parts map[string][]int32) {
	c.lagMu.Lock()
	defer c.lagMu.Unlock()
	for t, ps := range parts {
		for _, p := range ps {
			delete(c.pending[t], p)
			delete(c.lag[t], p)
		}
	}
}

// setLag records a partition's lag after a handled batch. It comes from the
// high watermark the fetch returned anyway, so lag costs no request; a
// partition with nothing new is not fetched again and keeps its last value,
// which the batch that caught up set to zero.
func (c *Consumer) setLag(topic string, partition int32, lag int64) {
	c.lagMu.Lock()
	defer c.lagMu.Unlock()
	if c.lag[topic] == nil {
		c.lag[topic] = map[int32]int64{}
	}
	c.lag[topic][partition] = max(lag, 0)
}

// Lag returns, per topic, the records beyond those handled in the partitions
// this member owns, as of each partition's last fetch.
func (c *Consumer) Lag() map[string]int64 {
	c.lagMu.Lock()
	defer c.lagMu.Unlock()
	out := make(map[string]int64, len(c.lag))
	for t, ps := range c.lag {
		for _, n := range ps {
			out[t] += n
		}
	}
	return out
}

// registerLag reports Lag through the global meter provider, so every
// consumer reports it without wiring of its own. Replicas report the
// partitions each owns: their sum is the group's lag.
func (c *Consumer) registerLag() (metric.Registration, error) {
	return RegisterLag(c.group, c.Lag)
}

// RegisterLag reports a consumer group member's lag, per topic, as
// flo.consumer.lag through the global meter provider, for readers that are
// not a Consumer (the dispatcher's partition owners).
func RegisterLag(group string, lag func() map[string]int64) (metric.Registration, error) {
	meter := otel.Meter("github.com/razorbill/flo/libs/kafka")
	gauge, err := meter.Int64ObservableGauge("flo.consumer.lag", metric.WithUnit("{record}"),
		metric.WithDescription("Records in the log beyond those the consumer group handled, in the partitions this member owns."))
	if err != nil {
		return nil, fmt.Errorf("create consumer lag gauge: %w", err)
	}
	// Lag is in memory: a zero max age reads it afresh on every collection.
	read := func(context.Context) (map[string]int64, error) { return lag(), nil }
	return telemetry.NewGauges(meter, 0, read, func(byTopic map[string]int64, o metric.Observer) {
		for topic, n := range byTopic {
			o.ObserveInt64(gauge, n, metric.WithAttributes(attribute.String("topic", topic), attribute.String("group", group)))
		}
	}, gauge).Register()
}

// withoutControl drops transaction markers, which no handler wants.
func withoutControl(recs []*kgo.Record) []*kgo.Record {
	for i, r := range recs {
		if r.Attrs.IsControl() {
			out := slices.Clip(recs[:i])
			for _, r := range recs[i+1:] {
				if !r.Attrs.IsControl() {
					out = append(out, r)
				}
			}
			return out
		}
	}
	return recs
}

func containsPartition(parts map[string][]int32, topic string, partition int32) bool {
	for _, p := range parts[topic] {
		if p == partition {
			return true
		}
	}
	return false
}

func logFetchErrors(ctx context.Context, log *slog.Logger, fetches kgo.Fetches) {
	for _, fe := range fetches.Errors() {
		if errors.Is(fe.Err, context.Canceled) || errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, kgo.ErrClientClosed) {
			continue
		}
		log.WarnContext(ctx, "fetch failed", "topic", fe.Topic, "partition", fe.Partition, "error", fe.Err)
	}
}
