// Package appender appends records to stream topics: it validates them,
// picks partitions (by key, or spread in contiguous runs), stamps append
// times that never go backwards within a partition on this replica, produces
// a whole append at once and waits for every acknowledgement, and puts the
// acknowledged records in the read cache.
package appender

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/services/streams/internal/logread"
	"github.com/razorbill/flo/services/streams/internal/record"
	"github.com/razorbill/flo/services/streams/internal/store"
)

// Limits of one append.
const (
	MaxRecords = 10_000
	MaxHeaders = 64
	// MaxHeaderBytes bounds a record's key and headers together; payloads
	// have their own, configurable limit.
	MaxHeaderBytes = 64 << 10
)

// Record is one record to append.
type Record struct {
	Payload []byte
	Key     string
	Headers map[string]string
}

// Appender appends records.
type Appender struct {
	cl             *kgo.Client
	reader         *logread.Reader
	maxRecordBytes int

	mu    sync.Mutex
	parts map[partitionKey]*partitionState
	// spread picks the first partition of keyless appends, so
	// consecutive appends go to different partitions.
	spread atomic.Uint32
}

type partitionKey struct {
	topic     string
	partition int32
}

// partitionState serialises stamping and producing for one partition, so
// append times are non-decreasing in the partition's log order and an
// append's records in a partition get consecutive offsets.
type partitionState struct {
	mu     sync.Mutex
	lastMS int64
}

// BatchBytes is the producer batch size the client needs for records of up
// to maxRecordBytes: one record with the largest key and headers must fit.
func BatchBytes(maxRecordBytes int) int32 {
	return int32(maxRecordBytes + MaxHeaderBytes + 4<<10)
}

// ClientOptions are the producer settings an Appender's client needs: we
// pick partitions ourselves, and a batch must hold the largest record.
func ClientOptions(maxRecordBytes int) []kgo.Opt {
	return []kgo.Opt{
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytes(max(BatchBytes(maxRecordBytes), 1<<20)),
	}
}

// TopicMaxMessageBytes is the max.message.bytes stream topics need.
func TopicMaxMessageBytes(maxRecordBytes int) int {
	return max(int(BatchBytes(maxRecordBytes)), 1<<20, kafka.MaxRecordBytes)
}

// New returns an Appender producing with cl (made with ClientOptions).
func New(cl *kgo.Client, reader *logread.Reader, maxRecordBytes int) *Appender {
	return &Appender{cl: cl, reader: reader, maxRecordBytes: maxRecordBytes, parts: map[partitionKey]*partitionState{}}
}

// Append validates records and appends them to st as one produce; it
// returns their ids in request order once the broker acknowledged them all.
// If it fails, some records may have been appended (as with any produce);
// the caller retries.
func (a *Appender) Append(ctx context.Context, st store.Stream, recs []Record) ([]record.ID, error) {
	if err := a.validate(recs); err != nil {
		return nil, err
	}
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		kr := &kgo.Record{Topic: st.Topic(), Value: r.Payload, Partition: -1}
		if r.Key != "" {
			kr.Key = []byte(r.Key)
		}
		for k, v := range r.Headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		kafka.InjectTrace(ctx, kr)
		out[i] = kr
	}
	return a.Produce(ctx, st, out)
}

func (a *Appender) validate(recs []Record) error {
	switch {
	case len(recs) == 0:
		return fault.Invalidf("records: at least one record is required")
	case len(recs) > MaxRecords:
		return fault.Invalidf("records: %d records in one append, at most %d", len(recs), MaxRecords)
	}
	for i, r := range recs {
		switch {
		case len(r.Payload) == 0:
			return fault.Invalidf("records[%d].payload is empty", i)
		case len(r.Payload) > a.maxRecordBytes:
			return fault.Invalidf("records[%d].payload is %d bytes, over the limit of %d", i, len(r.Payload), a.maxRecordBytes)
		case len(r.Headers) > MaxHeaders:
			return fault.Invalidf("records[%d].headers has %d entries, at most %d", i, len(r.Headers), MaxHeaders)
		}
		size := len(r.Key)
		for k, v := range r.Headers {
			if k == "" {
				return fault.Invalidf("records[%d].headers: a header name is empty", i)
			}
			if record.IsTraceHeader(k) {
				return fault.Invalidf("records[%d].headers: %q is reserved for the trace context", i, k)
			}
			size += len(k) + len(v)
		}
		if size > MaxHeaderBytes {
			return fault.Invalidf("records[%d]: key and headers are %d bytes, at most %d", i, size, MaxHeaderBytes)
		}
	}
	return nil
}

// Produce appends ready log records to st: those with a Key go to the
// partition their key hashes to, the others are spread over the partitions
// in contiguous runs. It returns their ids in order once all are
// acknowledged.
func (a *Appender) Produce(ctx context.Context, st store.Stream, recs []*kgo.Record) ([]record.ID, error) {
	byPartition := a.assign(st.Partitions, recs)
	var (
		wg      sync.WaitGroup
		errMu   sync.Mutex
		errs    []error
		promise = func(_ *kgo.Record, err error) {
			if err != nil {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			}
			wg.Done()
		}
	)
	wg.Add(len(recs))
	for p, rs := range byPartition {
		if len(rs) == 0 {
			continue
		}
		ps := a.partition(st.Topic(), int32(p))
		ps.mu.Lock()
		ms := max(time.Now().UnixMilli(), ps.lastMS)
		ps.lastMS = ms
		stamp := time.UnixMilli(ms)
		for _, r := range rs {
			r.Timestamp = stamp
			a.cl.Produce(ctx, r, promise)
		}
		ps.mu.Unlock()
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, fmt.Errorf("append to %s: %w", st.Topic(), errors.Join(errs...))
	}
	for p, rs := range byPartition {
		if len(rs) == 0 {
			continue
		}
		first, last := rs[0].Offset, rs[len(rs)-1].Offset
		if last-first+1 == int64(len(rs)) {
			a.reader.Cache().Add(st.Topic(), int32(p), first, rs)
		}
		a.reader.Advance(st.Topic(), int32(p), last+1)
	}
	ids := make([]record.ID, len(recs))
	for i, r := range recs {
		ids[i] = record.NewID(r.Timestamp.UnixMilli(), r.Partition, r.Offset)
	}
	return ids, nil
}

// assign sets each record's partition and returns them grouped by
// partition, in request order within each.
func (a *Appender) assign(partitions int32, recs []*kgo.Record) [][]*kgo.Record {
	byPartition := make([][]*kgo.Record, partitions)
	keyless := 0
	for _, r := range recs {
		if len(r.Key) == 0 {
			keyless++
		}
	}
	// Keyless records are cut into at most one run per partition, so a
	// batch still makes few, large produce batches.
	runs := min(int(partitions), keyless)
	start := int32(0)
	if keyless > 0 {
		start = int32(a.spread.Add(1) % uint32(partitions))
	}
	j := 0
	for _, r := range recs {
		var p int32
		if len(r.Key) > 0 {
			h := fnv.New32a()
			_, _ = h.Write(r.Key)
			p = int32(h.Sum32() % uint32(partitions))
		} else {
			p = (start + int32(j*runs/keyless)) % partitions
			j++
		}
		r.Partition = p
		byPartition[p] = append(byPartition[p], r)
	}
	return byPartition
}

func (a *Appender) partition(topic string, p int32) *partitionState {
	k := partitionKey{topic, p}
	a.mu.Lock()
	defer a.mu.Unlock()
	ps := a.parts[k]
	if ps == nil {
		ps = &partitionState{}
		a.parts[k] = ps
	}
	return ps
}

// Forget drops what the appender keeps about a deleted stream's topic.
func (a *Appender) Forget(topic string, partitions int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for p := range partitions {
		delete(a.parts, partitionKey{topic, p})
	}
}
