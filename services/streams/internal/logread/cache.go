package logread

import (
	"container/list"
	"sort"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Cache holds recently appended and fetched records, decoded, bounded by
// their bytes. Consumers of a group, several groups, and range reads of a
// stream mostly read what was just appended or fetched, so most group reads
// are served here instead of by a broker fetch (which returns whole produce
// batches, often far more than one read wants). Records at an offset never
// change (a stream's topic is never reused), so nothing is ever stale.
type Cache struct {
	mu       sync.Mutex
	maxBytes int64
	bytes    int64
	lru      *list.List // of *chunk, most recently used at the front
	parts    map[topicPartition][]*chunk
}

type topicPartition struct {
	topic     string
	partition int32
}

// chunk is a run of records of one partition: every record from offset
// first up to (not including) end, in offset order.
type chunk struct {
	tp      topicPartition
	first   int64
	end     int64
	records []*kgo.Record
	bytes   int64
	elem    *list.Element
}

// NewCache returns a cache holding up to maxBytes of record data; zero or
// less disables it.
func NewCache(maxBytes int64) *Cache {
	return &Cache{maxBytes: maxBytes, lru: list.New(), parts: map[topicPartition][]*chunk{}}
}

// Add stores records of one partition that are every record of the log from
// first up to the last of them (in offset order; none missing in between).
func (c *Cache) Add(topic string, partition int32, first int64, records []*kgo.Record) {
	if c.maxBytes <= 0 || len(records) == 0 {
		return
	}
	ch := &chunk{
		tp:      topicPartition{topic, partition},
		first:   first,
		end:     records[len(records)-1].Offset + 1,
		records: records,
	}
	for _, r := range records {
		ch.bytes += recordBytes(r)
	}
	if ch.bytes > c.maxBytes/4 {
		// One huge fetch would push everything else out.
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Chunks never contain one another, so sorted by first offset they
	// are sorted by end too, and the chunk holding an offset is the last
	// one starting at or before it.
	chunks := c.parts[ch.tp]
	i := sort.Search(len(chunks), func(i int) bool { return chunks[i].first >= ch.first })
	if i > 0 && chunks[i-1].end >= ch.end {
		return // already held
	}
	if i < len(chunks) && chunks[i].first == ch.first && chunks[i].end >= ch.end {
		return
	}
	for i < len(chunks) && chunks[i].end <= ch.end {
		c.lru.Remove(chunks[i].elem)
		c.bytes -= chunks[i].bytes
		chunks = append(chunks[:i], chunks[i+1:]...)
	}
	chunks = append(chunks, nil)
	copy(chunks[i+1:], chunks[i:])
	chunks[i] = ch
	c.parts[ch.tp] = chunks
	ch.elem = c.lru.PushFront(ch)
	c.bytes += ch.bytes
	for c.bytes > c.maxBytes {
		c.evict(c.lru.Back().Value.(*chunk))
	}
}

// Get appends to dst the records of partition from offset from on, in
// offset order and without gaps, up to max records, and returns dst and the
// offset after the last record it appended (from when none).
func (c *Cache) Get(dst []*kgo.Record, topic string, partition int32, from int64, max int) ([]*kgo.Record, int64) {
	if c.maxBytes <= 0 {
		return dst, from
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	chunks := c.parts[topicPartition{topic, partition}]
	next := from
	for taken := 0; taken < max; {
		ch := findChunk(chunks, next)
		if ch == nil {
			break
		}
		c.lru.MoveToFront(ch.elem)
		j := sort.Search(len(ch.records), func(j int) bool { return ch.records[j].Offset >= next })
		for ; j < len(ch.records) && taken < max; j++ {
			dst = append(dst, ch.records[j])
			taken++
		}
		if j < len(ch.records) {
			next = ch.records[j].Offset
			break
		}
		next = ch.end
	}
	return dst, next
}

// findChunk returns the chunk that holds offset off, if any.
func findChunk(chunks []*chunk, off int64) *chunk {
	i := sort.Search(len(chunks), func(i int) bool { return chunks[i].first > off })
	if i > 0 && chunks[i-1].end > off {
		return chunks[i-1]
	}
	return nil
}

// Forget drops every record of topic.
func (c *Cache) Forget(topic string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for tp, chunks := range c.parts {
		if tp.topic != topic {
			continue
		}
		for _, ch := range chunks {
			c.lru.Remove(ch.elem)
			c.bytes -= ch.bytes
		}
		delete(c.parts, tp)
	}
}

func (c *Cache) evict(ch *chunk) {
	c.lru.Remove(ch.elem)
	c.bytes -= ch.bytes
	chunks := c.parts[ch.tp]
	for i, x := range chunks {
		if x == ch {
			chunks = append(chunks[:i], chunks[i+1:]...)
			break
		}
	}
	if len(chunks) == 0 {
		delete(c.parts, ch.tp)
	} else {
		c.parts[ch.tp] = chunks
	}
}

// recordBytes estimates the memory a record holds.
func recordBytes(r *kgo.Record) int64 {
	n := int64(len(r.Key) + len(r.Value) + 128)
	for _, h := range r.Headers {
		n += int64(len(h.Key) + len(h.Value) + 32)
	}
	return n
}
