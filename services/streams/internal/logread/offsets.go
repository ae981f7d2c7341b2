package logread

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/razorbill/flo/libs/retry"
)

// Special ListOffsets timestamps.
const (
	latest   = -1
	earliest = -2
)

// ListStarts returns the first offset still held of each partition.
func (r *Reader) ListStarts(ctx context.Context, topic string, partitions int32) ([]int64, error) {
	return r.listOffsets(ctx, topic, partitions, earliest)
}

// ListEnds returns each partition's end (the offset the next record gets).
func (r *Reader) ListEnds(ctx context.Context, topic string, partitions int32) ([]int64, error) {
	ends, err := r.listOffsets(ctx, topic, partitions, latest)
	if err != nil {
		return nil, err
	}
	for p, e := range ends {
		r.advance(topic, int32(p), e)
	}
	return ends, nil
}

// ListAfter returns, for each of times (in milliseconds) and per
// partition, the first offset whose record was appended at or after that
// time, or the partition's end when there is none. The ends are asked for
// first: a record appended between the two requests then makes the answer
// an offset too early, which readers filter by id, never one too late,
// which would skip it.
func (r *Reader) ListAfter(ctx context.Context, topic string, partitions int32, times ...int64) ([][]int64, error) {
	ends, err := r.ListEnds(ctx, topic, partitions)
	if err != nil {
		return nil, err
	}
	out := make([][]int64, len(times))
	for i, ms := range times {
		offsets, err := r.listOffsets(ctx, topic, partitions, ms)
		if err != nil {
			return nil, err
		}
		for p, o := range offsets {
			if o < 0 {
				offsets[p] = ends[p]
			}
		}
		out[i] = offsets
	}
	return out, nil
}

// listOffsets asks the partition leaders (the client shards the request)
// for offsets by timestamp, retrying for up to retryFor.
func (r *Reader) listOffsets(ctx context.Context, topic string, partitions int32, ts int64) ([]int64, error) {
	start := time.Now()
	b := readRetry.Backoff()
	for {
		out, err := r.listOffsetsOnce(ctx, topic, partitions, ts)
		if err == nil {
			return out, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// A topic still missing after a second is gone, not new.
		if time.Since(start) > retryFor || (errors.Is(err, kerr.UnknownTopicOrPartition) && time.Since(start) > time.Second) {
			return nil, fmt.Errorf("%w: list offsets of %s: %w", ErrUnavailable, topic, err)
		}
		if !retry.Sleep(ctx, b.NextBackOff()) {
			return nil, ctx.Err()
		}
	}
}

func (r *Reader) listOffsetsOnce(ctx context.Context, topic string, partitions int32, ts int64) ([]int64, error) {
	out, failed, err := r.listOffsetsOf(ctx, map[string]int32{topic: partitions}, ts)
	if err != nil {
		return nil, err
	}
	if err := failed[topic]; err != nil {
		return nil, err
	}
	return out[topic], nil
}

// ListBounds returns, for every topic (with its partition count), the first
// offset still held and the end of each partition, in two requests however
// many topics there are and without retrying: it serves gauges, which a
// broker that does not answer should leave unreported, not hold up. A topic
// the broker could not answer for (a stream being deleted) is left out.
func (r *Reader) ListBounds(ctx context.Context, topics map[string]int32) (starts, ends map[string][]int64, err error) {
	starts, failedStarts, err := r.listOffsetsOf(ctx, topics, earliest)
	if err != nil {
		return nil, nil, err
	}
	ends, failedEnds, err := r.listOffsetsOf(ctx, topics, latest)
	if err != nil {
		return nil, nil, err
	}
	for topic := range topics {
		if failedStarts[topic] != nil || failedEnds[topic] != nil {
			delete(starts, topic)
			delete(ends, topic)
		}
	}
	return starts, ends, nil
}

// listOffsetsOf asks the partition leaders (the client shards the request)
// for offsets by timestamp of every partition of topics, once. failed holds
// the topics whose partitions did not all get an answer.
func (r *Reader) listOffsetsOf(ctx context.Context, topics map[string]int32, ts int64) (out map[string][]int64, failed map[string]error, err error) {
	if len(topics) == 0 {
		return map[string][]int64{}, nil, nil
	}
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	for topic, partitions := range topics {
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for p := range partitions {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition = p
			rp.Timestamp = ts
			rp.CurrentLeaderEpoch = -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, r.cl)
	if err != nil {
		return nil, nil, fmt.Errorf("list offsets of %d topics: %w", len(topics), err)
	}
	out = make(map[string][]int64, len(topics))
	failed = map[string]error{}
	seen := make(map[string][]bool, len(topics))
	for topic, partitions := range topics {
		out[topic] = make([]int64, partitions)
		seen[topic] = make([]bool, partitions)
	}
	for _, t := range resp.Topics {
		offsets, ok := out[t.Topic]
		if !ok {
			continue
		}
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				failed[t.Topic] = fmt.Errorf("list offsets of %s/%d: %w", t.Topic, p.Partition, err)
				continue
			}
			if p.Partition >= 0 && int(p.Partition) < len(offsets) {
				offsets[p.Partition] = p.Offset
				seen[t.Topic][p.Partition] = true
			}
		}
	}
	for topic, ps := range seen {
		for p, ok := range ps {
			if !ok && failed[topic] == nil {
				failed[topic] = fmt.Errorf("list offsets of %s: no answer for partition %d", topic, p)
			}
		}
	}
	for topic := range failed {
		delete(out, topic)
	}
	return out, failed, nil
}
