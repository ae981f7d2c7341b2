// Package kafka wraps franz-go for the services: a client with our defaults,
// topic creation, W3C trace context in record headers, a consumer-group
// member that commits only what its handler finished, and a group-less tail
// for in-memory wake-ups.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/config"
)

// NewClient returns a franz-go client for the brokers of conn with defaults tuned for
// throughput at low latency: a 1 ms linger so concurrent produces share a
// batch without adding visible delay, 1 MiB batches (NewProducer sizes them
// for the payload limit), acks from all in-sync replicas with the idempotent
// producer (franz-go's default), retries until the record's context ends,
// and a bounded produce buffer (produce blocks when it is full, which is our
// back-pressure). opts are applied last and override any default.
func NewClient(conn config.Kafka, opts ...kgo.Opt) (*kgo.Client, error) {
	// Lets a dev broker (kfake) create a topic on first use; brokers with
	// auto-creation disabled ignore it, and services create their topics
	// with EnsureTopics anyway.
	return newClient(conn, append([]kgo.Opt{kgo.AllowAutoTopicCreation()}, opts...)...)
}

// NewManagedTopicsClient is NewClient for topics the caller creates and
// deletes itself (the streams service's stream topics): it never creates a
// topic on first use, so a produce or offset lookup that races the topic's
// deletion fails instead of recreating it with the broker's defaults.
func NewManagedTopicsClient(conn config.Kafka, opts ...kgo.Opt) (*kgo.Client, error) {
	return newClient(conn, opts...)
}

// newClient is NewClient without topic auto-creation.
func newClient(conn config.Kafka, opts ...kgo.Opt) (*kgo.Client, error) {
	if len(conn.Brokers) == 0 {
		return nil, errors.New("new kafka client: no brokers")
	}
	security, err := securityOpts(conn)
	if err != nil {
		return nil, fmt.Errorf("new kafka client: %w", err)
	}
	base := []kgo.Opt{
		kgo.SeedBrokers(conn.Brokers...),
		kgo.ProducerLinger(time.Millisecond),
		kgo.ProducerBatchMaxBytes(defaultBatchBytes),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordRetries(math.MaxInt),
		kgo.MaxBufferedRecords(50_000),
		kgo.MaxBufferedBytes(256 << 20),
		// New topics and partitions are noticed quickly, without letting a
		// flood of refresh triggers hammer the brokers.
		kgo.MetadataMinAge(250 * time.Millisecond),
		// Partitions added to a topic (a repartition of the task topics)
		// reach producers and consumer groups within this, not franz-go's
		// five minutes.
		kgo.MetadataMaxAge(30 * time.Second),
		// A fetch in flight does not include partitions assigned after it
		// was sent; a short long-poll bounds how long those wait for their
		// first records. Idle fetches twice a second cost nothing.
		kgo.FetchMaxWait(500 * time.Millisecond),
	}
	base = append(base, security...)
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("new kafka client: %w", err)
	}
	return cl, nil
}

// RecordEnvelopeBytes is the room a record needs above the largest payload
// it carries: ids, names, capped free text (errors, outcomes), timestamps,
// trace headers, protobuf framing and the record batch's own header.
const RecordEnvelopeBytes = 256 << 10

// MaxRecordSize is the largest record the platform can legally make when
// payloads, results and run inputs are at most maxPayloadBytes
// (FLO_MAX_PAYLOAD_BYTES): a COMPLETED task event carrying a result, an
// InvokeTask carrying a run's input.
func MaxRecordSize(maxPayloadBytes int) int { return maxPayloadBytes + RecordEnvelopeBytes }

// NewProducer is NewClient for a service that produces to topics: its
// batches hold the largest record the platform can legally make with
// payloads of maxPayloadBytes (MaxRecordSize), and it creates the topics
// that do not exist yet (EnsureTopics). A payload limit whose records the
// topics could not accept is an error. On failure nothing stays open.
func NewProducer(ctx context.Context, conn config.Kafka, partitions int32, maxPayloadBytes int, topics []string, opts ...kgo.Opt) (*kgo.Client, error) {
	if maxPayloadBytes <= 0 || MaxRecordSize(maxPayloadBytes) > MaxRecordBytes {
		return nil, fmt.Errorf("new producer: FLO_MAX_PAYLOAD_BYTES must be between 1 and %d, got %d", MaxRecordBytes-RecordEnvelopeBytes, maxPayloadBytes)
	}
	size := kgo.ProducerBatchMaxBytes(int32(max(MaxRecordSize(maxPayloadBytes), defaultBatchBytes)))
	cl, err := NewClient(conn, append([]kgo.Opt{size}, opts...)...)
	if err != nil {
		return nil, err
	}
	if err := EnsureTopics(ctx, cl, partitions, topics...); err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

// PartitionOf is the partition, of a topic with n partitions, that our
// producers send a record keyed by key to: Kafka's own key hash (murmur2), as
// franz-go's default partitioner applies it, so it agrees with every producer
// that leaves partitioning to the client. It is computed here, on the string,
// because franz-go takes the key inside a record, which costs an allocation
// per call on paths that route every task.
func PartitionOf(key string, n int32) int32 {
	return int32(murmur2(key)&0x7fffffff) % n
}

// murmur2 is MurmurHash2 with Kafka's seed, over the key's bytes taken four
// at a time, little-endian.
func murmur2(key string) uint32 {
	const (
		seed  uint32 = 0x9747b28c
		m     uint32 = 0x5bd1e995
		shift        = 24
	)
	h := seed ^ uint32(len(key))
	i := 0
	for ; len(key)-i >= 4; i += 4 {
		k := uint32(key[i]) | uint32(key[i+1])<<8 | uint32(key[i+2])<<16 | uint32(key[i+3])<<24
		k *= m
		k ^= k >> shift
		k *= m
		h = h*m ^ k
	}
	switch len(key) - i {
	case 3:
		h ^= uint32(key[i+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(key[i+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(key[i])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// defaultBatchBytes bounds a produced batch unless NewProducer sizes it for
// the payload limit; it is also the smallest batch NewProducer makes, so a
// small payload limit does not make batches of small records smaller.
const defaultBatchBytes = 1 << 20

// MaxRecordBytes is the largest record the topics we create accept.
const MaxRecordBytes = 8 << 20

// EnsureTopics creates the topics that do not exist yet with the given number
// of partitions and the broker's default replication; existing topics are
// left as they are.
func EnsureTopics(ctx context.Context, cl *kgo.Client, partitions int32, topics ...string) error {
	if len(topics) == 0 {
		return nil
	}
	// Records carry user payloads up to a few MiB (payload limit plus
	// envelope); brokers default to about 1 MiB per message.
	maxMessage := strconv.Itoa(MaxRecordBytes)
	configs := map[string]*string{"max.message.bytes": &maxMessage}
	resps, err := kadm.NewClient(cl).CreateTopics(ctx, partitions, -1, configs, topics...)
	if err != nil {
		return fmt.Errorf("create topics %v: %w", topics, err)
	}
	for _, r := range resps {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}
