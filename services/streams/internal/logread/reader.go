// Package logread reads stream records from the log by offset: straight
// fetch requests to partition leaders (no consumer group, no client-side
// buffering of whole streams), a bounded cache of decoded records, offset
// lookups by time, and high-watermark tracking with one long-polling watcher
// over the streams readers wait on, which wakes them when records arrive.
package logread

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/razorbill/flo/libs/retry"
)

// ErrUnavailable is returned (wrapped) when the broker could not answer in
// time; the caller may retry.
var ErrUnavailable = errors.New("log unavailable")

// Limits of one fetch.
const (
	// minPartitionBytes is the least a partition fetch asks for, so small
	// reads still get a useful chunk for the cache.
	minPartitionBytes = 64 << 10
	// maxPartitionBytes bounds what one partition of a fetch may return
	// (the broker still returns a first batch larger than this whole).
	maxPartitionBytes = 8 << 20
	// maxFetchBytes bounds a whole fetch response.
	maxFetchBytes = 32 << 20
	// retryFor bounds how long a read retries a broker that does not answer.
	retryFor = 10 * time.Second
)

// readRetry is how a read waits between attempts within retryFor.
var readRetry = retry.Policy{Initial: 20 * time.Millisecond, Max: time.Second}

// Reader reads stream topics.
type Reader struct {
	cl      *kgo.Client
	watchCl *kgo.Client
	cache   *Cache
	log     *slog.Logger

	// onAdvance is told when a topic's known high watermark grew, so
	// readers blocked on it can look again.
	onAdvance func(topic string)

	mu      sync.Mutex
	topics  map[string]*topicMeta
	marks   map[string][]int64
	sizes   map[string]int64 // average record bytes seen per topic
	watches map[string]*watched
	kick    chan struct{}
}

// topicMeta is what a fetch needs to know about a topic.
type topicMeta struct {
	id      [16]byte
	leaders []int32
}

// New returns a Reader reading with cl and long-polling with watchCl (a
// client nothing else uses; see Watch); it closes neither. onAdvance is
// called, without locks held, whenever records are seen beyond what was
// known of a topic's end.
func New(cl, watchCl *kgo.Client, cache *Cache, onAdvance func(topic string), log *slog.Logger) *Reader {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reader{
		cl: cl, watchCl: watchCl, cache: cache, log: log, onAdvance: onAdvance,
		topics: map[string]*topicMeta{}, marks: map[string][]int64{}, sizes: map[string]int64{},
		watches: map[string]*watched{}, kick: make(chan struct{}, 1),
	}
}

// Cache is the reader's record cache, which appenders fill too.
func (r *Reader) Cache() *Cache { return r.cache }

// Want asks for up to Max records of Partition from offset From on.
type Want struct {
	Partition int32
	From      int64
	Max       int
}

// Got is what one partition returned.
type Got struct {
	Partition int32
	// From is where the records start: Want.From, or the log start when
	// retention removed the records before it.
	From int64
	// Records are every record from From on, in offset order, at most Max.
	Records []*kgo.Record
	// Next is the offset after the last record returned (From when none).
	Next int64
	// End is the partition's high watermark when the broker was asked, -1
	// when the cache answered.
	End int64
}

// Read returns records for each want: from the cache as far as it holds
// them, the rest with one fetch request per partition leader that does not
// wait for new records.
func (r *Reader) Read(ctx context.Context, topic string, wants []Want) ([]Got, error) {
	gots := make([]Got, len(wants))
	var missing []int
	for i, w := range wants {
		g := Got{Partition: w.Partition, From: w.From, End: -1}
		g.Records, g.Next = r.cache.Get(nil, topic, w.Partition, w.From, w.Max)
		gots[i] = g
		if len(g.Records) < w.Max {
			missing = append(missing, i)
		}
	}
	if len(missing) == 0 {
		return gots, nil
	}
	req := make([]fetchPart, len(missing))
	for j, i := range missing {
		req[j] = fetchPart{partition: wants[i].Partition, offset: gots[i].Next, max: wants[i].Max - len(gots[i].Records)}
	}
	res, err := r.fetch(ctx, topic, req)
	if err != nil {
		return nil, err
	}
	for j, i := range missing {
		f := res[j]
		g := &gots[i]
		g.End = f.end
		if len(g.Records) == 0 {
			g.From = f.from
		}
		n := min(len(f.records), wants[i].Max-len(g.Records))
		g.Records = append(g.Records, f.records[:n]...)
		if n > 0 {
			g.Next = f.records[n-1].Offset + 1
		} else if len(g.Records) == 0 {
			g.Next = g.From
		}
	}
	return gots, nil
}

// fetchPart is one partition of a fetch.
type fetchPart struct {
	partition int32
	offset    int64
	max       int
}

// fetched is what a fetch returned for one partition.
type fetched struct {
	from    int64
	records []*kgo.Record
	end     int64
}

// fetch asks partition leaders for records without waiting for new ones,
// retrying leadership changes and unreachable brokers for up to retryFor. A
// partition whose offset is before the log start is fetched again from the
// log start.
func (r *Reader) fetch(ctx context.Context, topic string, parts []fetchPart) ([]fetched, error) {
	out := make([]fetched, len(parts))
	todo := make([]int, len(parts))
	for i, p := range parts {
		out[i] = fetched{from: p.offset, end: -1}
		todo[i] = i
	}
	deadline := time.Now().Add(retryFor)
	b := readRetry.Backoff()
	for attempt := 0; ; attempt++ {
		again, err := r.fetchOnce(ctx, topic, parts, out, todo)
		if err == nil && len(again) == 0 {
			return out, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err == nil {
			err = errors.New("partitions not ready")
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: fetch %s: %w", ErrUnavailable, topic, err)
		}
		if attempt > 0 {
			r.log.DebugContext(ctx, "fetch retrying", "topic", topic, "error", err)
			if !retry.Sleep(ctx, b.NextBackOff()) {
				return nil, ctx.Err()
			}
		}
		r.forgetTopic(topic)
		if len(again) > 0 {
			todo = again
		}
	}
}

// fetchOnce sends one fetch per leader for the todo partitions and fills
// out; it returns the partitions to try again (after a metadata refresh).
func (r *Reader) fetchOnce(ctx context.Context, topic string, parts []fetchPart, out []fetched, todo []int) ([]int, error) {
	meta, err := r.topic(ctx, topic)
	if err != nil {
		return nil, err
	}
	avg := r.avgSize(topic)
	byLeader := map[int32][]int{}
	for _, i := range todo {
		p := parts[i].partition
		if int(p) >= len(meta.leaders) || meta.leaders[p] < 0 {
			return todo, fmt.Errorf("partition %d has no leader", p)
		}
		byLeader[meta.leaders[p]] = append(byLeader[meta.leaders[p]], i)
	}
	type answer struct {
		retry []int
		err   error
	}
	answers := make(chan answer, len(byLeader))
	for leader, idx := range byLeader {
		go func() {
			retry, err := r.fetchFrom(ctx, leader, topic, meta.id, parts, out, idx, avg)
			answers <- answer{retry, err}
		}()
	}
	var (
		retry []int
		errs  []error
	)
	for range byLeader {
		a := <-answers
		retry = append(retry, a.retry...)
		if a.err != nil {
			errs = append(errs, a.err)
		}
	}
	return retry, errors.Join(errs...)
}

// fetchFrom sends one fetch to leader for the partitions idx.
func (r *Reader) fetchFrom(ctx context.Context, leader int32, topic string, id [16]byte, parts []fetchPart, out []fetched, idx []int, avg int64) ([]int, error) {
	req := newFetchRequest(0)
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	rt.TopicID = id
	for _, i := range idx {
		rt.Partitions = append(rt.Partitions, fetchPartition(parts[i].partition, out[i].from, int64(parts[i].max)*avg*2))
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, r.cl.Broker(int(leader)))
	if err != nil {
		return idx, fmt.Errorf("fetch from broker %d: %w", leader, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return idx, fmt.Errorf("fetch from broker %d: %w", leader, err)
	}
	byPartition := make(map[int32]*kmsg.FetchResponseTopicPartition, len(idx))
	for ti := range resp.Topics {
		for pi := range resp.Topics[ti].Partitions {
			rp := &resp.Topics[ti].Partitions[pi]
			byPartition[rp.Partition] = rp
		}
	}
	var retry []int
	for _, i := range idx {
		rp := byPartition[parts[i].partition]
		if rp == nil {
			retry = append(retry, i)
			continue
		}
		recs, end, restart, err := r.take(topic, out[i].from, rp)
		switch {
		case err != nil:
			retry = append(retry, i)
		case restart >= 0:
			out[i].from = restart
			retry = append(retry, i)
		default:
			out[i].records, out[i].end = recs, end
		}
	}
	return retry, nil
}

// newFetchRequest is a sessionless fetch that waits up to wait for records.
func newFetchRequest(wait time.Duration) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(wait / time.Millisecond)
	req.MinBytes = 1
	req.MaxBytes = maxFetchBytes
	req.SessionID = 0
	req.SessionEpoch = -1
	return req
}

// fetchPartition asks for one partition from offset, sized for want bytes.
func fetchPartition(partition int32, offset, want int64) kmsg.FetchRequestTopicPartition {
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = partition
	rp.FetchOffset = offset
	rp.CurrentLeaderEpoch = -1
	rp.LogStartOffset = -1
	rp.PartitionMaxBytes = int32(min(max(want, minPartitionBytes), maxPartitionBytes))
	return rp
}

// take decodes one partition of a fetch response asked from offset from:
// the records from there on and the partition's end, which it notes (cache,
// known end). restart >= 0 says retention removed records before from and
// the partition should be fetched again from restart.
func (r *Reader) take(topic string, from int64, rp *kmsg.FetchResponseTopicPartition) (recs []*kgo.Record, end, restart int64, err error) {
	p := rp.Partition
	fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Topic: topic, Partition: p, Offset: from}, rp, kgo.DefaultDecompressor(), nil)
	switch {
	case errors.Is(fp.Err, kerr.OffsetOutOfRange):
		r.advance(topic, p, fp.HighWatermark)
		if from < fp.LogStartOffset {
			return nil, 0, fp.LogStartOffset, nil
		}
		return nil, fp.HighWatermark, -1, nil
	case fp.Err != nil:
		return nil, 0, -1, fp.Err
	}
	r.noteSizes(topic, fp.Records)
	r.cache.Add(topic, p, from, fp.Records)
	r.advance(topic, p, fp.HighWatermark)
	return fp.Records, fp.HighWatermark, -1, nil
}

// topic returns a topic's metadata, asking the broker when it is not known.
func (r *Reader) topic(ctx context.Context, topic string) (*topicMeta, error) {
	r.mu.Lock()
	m := r.topics[topic]
	r.mu.Unlock()
	if m != nil {
		return m, nil
	}
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, r.cl)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return nil, fmt.Errorf("metadata of %s: %d topics returned", topic, len(resp.Topics))
	}
	t := resp.Topics[0]
	if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	m = &topicMeta{id: t.TopicID, leaders: make([]int32, len(t.Partitions))}
	for i := range m.leaders {
		m.leaders[i] = -1
	}
	for _, p := range t.Partitions {
		if int(p.Partition) < len(m.leaders) && kerr.ErrorForCode(p.ErrorCode) == nil {
			m.leaders[p.Partition] = p.Leader
		}
	}
	r.mu.Lock()
	r.topics[topic] = m
	r.mu.Unlock()
	return m, nil
}

func (r *Reader) forgetTopic(topic string) {
	r.mu.Lock()
	delete(r.topics, topic)
	r.mu.Unlock()
}

// Forget drops everything known about a deleted stream's topic.
func (r *Reader) Forget(topic string) {
	r.mu.Lock()
	delete(r.topics, topic)
	delete(r.marks, topic)
	delete(r.sizes, topic)
	r.mu.Unlock()
	r.cache.Forget(topic)
}

// Advance records that partition of topic holds records below end (an
// appender learned it from a produce acknowledgement).
func (r *Reader) Advance(topic string, partition int32, end int64) { r.advance(topic, partition, end) }

func (r *Reader) advance(topic string, partition int32, end int64) {
	if end < 0 {
		return
	}
	r.mu.Lock()
	marks := r.marks[topic]
	if int(partition) >= len(marks) {
		grown := make([]int64, partition+1)
		copy(grown, marks)
		for i := len(marks); i < len(grown); i++ {
			grown[i] = -1
		}
		marks = grown
		r.marks[topic] = marks
	}
	grew := end > marks[partition]
	if grew {
		marks[partition] = end
	}
	r.mu.Unlock()
	if grew && r.onAdvance != nil {
		r.onAdvance(topic)
	}
}

// known returns the known end of each of partitions of topic, -1 where none
// is known.
func (r *Reader) known(topic string, partitions int32) []int64 {
	out := make([]int64, partitions)
	r.mu.Lock()
	marks := r.marks[topic]
	for p := range out {
		out[p] = -1
		if p < len(marks) {
			out[p] = marks[p]
		}
	}
	r.mu.Unlock()
	return out
}

// noteSizes keeps a running average of record sizes, to size fetches.
func (r *Reader) noteSizes(topic string, records []*kgo.Record) {
	if len(records) == 0 {
		return
	}
	var total int64
	for _, rec := range records {
		total += int64(len(rec.Value) + len(rec.Key) + 64)
	}
	avg := total / int64(len(records))
	r.mu.Lock()
	if old, ok := r.sizes[topic]; ok {
		avg = (old*3 + avg) / 4
	}
	r.sizes[topic] = avg
	r.mu.Unlock()
}

func (r *Reader) avgSize(topic string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.sizes[topic]; ok {
		return s
	}
	return 1 << 10
}
