package kafka

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// maxPooledBytes is the largest decompression buffer kept for reuse: a rare
// huge batch (a record near the payload limit) is left to the collector
// rather than held by the pool.
const maxPooledBytes = 4 << 20

// fetchPool lends franz-go the buffers fetched batches are decompressed into
// and the slices their records are decoded into. A client given it
// (PooledFetches) recycles every record it polls (kgo.Record.Recycle) once
// nothing holds on to the record's key, value or headers: Consumer and Tail
// do after their handler returned, the dispatcher after the transaction
// that applied its commands. A record never recycled only costs its
// buffers' reuse. Decompressing the task events each consumer
// reads was the largest share of the bytes the platform allocated per task
// (docs/benchmarks.md, Session 22), and every collector cycle it brings
// slows every service in a process.
type fetchPool struct {
	bytes   sync.Pool // *[]byte
	records sync.Pool // *[]kgo.Record
}

// fetches is the one pool every consumer and tail shares: sync.Pool keeps
// per-processor caches, so sharing costs no contention.
var fetches = &fetchPool{}

// PooledFetches is the client option that makes franz-go take its fetch
// buffers from a pool shared by every client of the process. The client's
// owner recycles each polled record (kgo.Record.Recycle) when it is done with
// it: the record's memory is then reused, so nothing may read it again.
func PooledFetches() kgo.Opt { return kgo.WithPools(fetches) }

// GetDecompressBytes returns a buffer to decompress into; franz-go grows it
// when it is too small and puts the grown one back.
func (p *fetchPool) GetDecompressBytes([]byte, kgo.CompressionCodecType) []byte {
	if b, ok := p.bytes.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return nil
}

// PutDecompressBytes keeps b (zeroed by franz-go) for the next batch.
func (p *fetchPool) PutDecompressBytes(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooledBytes {
		return
	}
	p.bytes.Put(&b)
}

// GetRecords returns a slice for n records; franz-go grows it when it is too
// small.
func (p *fetchPool) GetRecords(n int) []kgo.Record {
	if r, ok := p.records.Get().(*[]kgo.Record); ok && cap(*r) >= n {
		return (*r)[:0]
	}
	return make([]kgo.Record, 0, n)
}

// PutRecords keeps rs for the next batch. franz-go zeroed each record as it
// was recycled, so the slice holds on to nothing.
func (p *fetchPool) PutRecords(rs []kgo.Record) {
	if cap(rs) == 0 {
		return
	}
	p.records.Put(&rs)
}

// recycle gives every record of fs, transaction markers included, back to
// the pool. Nothing may use them afterwards.
func recycle(fs kgo.Fetches) {
	fs.EachRecord(func(r *kgo.Record) { r.Recycle() })
}

// Recycle gives records a PooledFetches client polled back to the pool, for
// owners that keep records past their poll (the dispatcher's commands wait
// for the transaction that applies them). Nothing may use them afterwards.
func Recycle(records []*kgo.Record) {
	for _, r := range records {
		r.Recycle()
	}
}
