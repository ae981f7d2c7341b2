package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/kafka"
)

// benchStreams measures, on one broker in one run, the raw produce and
// consume rate of a plain franz-go client and then the same records through
// our layer: appended through the gateway with the SDK, and consumed by SDK
// stream workers in one consumer group until every record is acked.
func benchStreams(ctx context.Context, p *platform, o options) error {
	if o.batch == 0 {
		o.batch = 100
	}
	payload := bytes.Repeat([]byte("x"), o.payload)
	fmt.Printf("streams: %d records of %d bytes, %d partitions, batches of %d, %d producers, fsync=%v\n",
		o.records, o.payload, o.partitions, o.batch, o.producers, o.fsync)
	stopProfile, err := profile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()

	rawProduce, rawConsume, err := rawBroker(ctx, p.stack.KafkaBrokers(), o, payload)
	if err != nil {
		return err
	}
	fmt.Printf("  raw broker (franz-go): produce %.0f records/s (ProduceSync of %d); consume %.0f records/s (1 consumer)\n",
		rawProduce, o.batch, rawConsume)

	appendRate, err := appendStream(ctx, p.client, o, payload)
	if err != nil {
		return err
	}
	fmt.Printf("  flo: append %.0f records/s (AppendMany of %d)\n", appendRate, o.batch)
	consumeRate, redelivered, err := consumeStream(ctx, p, o)
	if err != nil {
		return err
	}
	fmt.Printf("  flo: group consume %.0f records/s until all acked (%d stream workers, BatchSize %d, %d slots; %d redelivered)\n",
		consumeRate, o.consumers, o.batch, o.concurrency, redelivered)
	fmt.Printf("  ours/raw: append %.3f, consume %.3f\n", appendRate/rawProduce, consumeRate/rawConsume)
	return nil
}

// benchStream is the stream the SDK appends to and its consumer group.
const (
	benchStream = "bench"
	benchGroup  = "bench"
)

// rawBroker produces o.records records to a fresh topic with o.producers
// goroutines, each producing a batch at a time and waiting for it, then
// reads them all back with one group-less consumer. Both clients have the
// settings our services use (libs/kafka).
func rawBroker(ctx context.Context, brokers []string, o options, payload []byte) (produce, consume float64, err error) {
	cl, err := kafka.NewManagedTopicsClient(config.Kafka{Brokers: brokers})
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	topic := "bench.raw." + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := kafka.EnsureTopics(ctx, cl, int32(o.partitions), topic); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	err = chunks(o.producers, o.records, o.batch, func(lo, hi int) error {
		batch := make([]*kgo.Record, hi-lo)
		for i := range batch {
			batch[i] = &kgo.Record{Topic: topic, Value: payload}
		}
		if err := cl.ProduceSync(ctx, batch...).FirstErr(); err != nil {
			return fmt.Errorf("raw produce: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	produce = perSecond(o.records, time.Since(start))

	reader, err := kafka.NewManagedTopicsClient(config.Kafka{Brokers: brokers}, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, 0, err
	}
	defer reader.Close()
	start = time.Now()
	for n := 0; n < o.records; {
		fs := reader.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			return 0, 0, fmt.Errorf("raw consume: %w", err)
		}
		n += fs.NumRecords()
	}
	return produce, perSecond(o.records, time.Since(start)), nil
}

// appendStream creates the stream and appends o.records records to it in
// AppendMany calls of o.batch from o.producers goroutines.
func appendStream(ctx context.Context, client *flo.Client, o options, payload []byte) (float64, error) {
	if _, err := client.CreateStream(ctx, benchStream, flo.StreamOptions{Partitions: o.partitions}); err != nil {
		return 0, fmt.Errorf("create stream: %w", err)
	}
	// The group exists before the records arrive, so the consume phase
	// measures consumption, not group creation.
	if _, err := client.CreateGroup(ctx, benchStream, benchGroup, flo.GroupOptions{Start: "-"}); err != nil {
		return 0, fmt.Errorf("create group: %w", err)
	}
	// Every batch carries the same payloads; the SDK only reads them.
	payloads := make([]any, o.batch)
	for i := range payloads {
		payloads[i] = payload
	}
	start := time.Now()
	err := chunks(o.producers, o.records, o.batch, func(lo, hi int) error {
		_, err := client.AppendMany(ctx, benchStream, payloads[:hi-lo])
		return err
	})
	if err != nil {
		return 0, err
	}
	return perSecond(o.records, time.Since(start)), nil
}

// consumeStream starts o.consumers stream workers in one group and waits
// until the group has handed out every record and holds none pending. It
// returns the rate and how many deliveries beyond one per record there were.
func consumeStream(ctx context.Context, p *platform, o options) (rate float64, redelivered int, err error) {
	var handled atomic.Int64
	allHandled := make(chan struct{})
	var once sync.Once
	handler := func(*flo.StreamContext) error {
		if handled.Add(1) == int64(o.records) {
			once.Do(func() { close(allHandled) })
		}
		return nil
	}
	start := time.Now()
	for i := range o.consumers {
		c, err := p.connect()
		if err != nil {
			return 0, 0, err
		}
		w, err := c.NewStreamWorker(flo.StreamWorkerOptions{
			Stream:      benchStream,
			Group:       benchGroup,
			Consumer:    fmt.Sprintf("consumer-%d", i),
			Concurrency: o.concurrency,
			BatchSize:   o.batch,
			Logger:      p.log,
		}, handler)
		if err != nil {
			return 0, 0, fmt.Errorf("new stream worker: %w", err)
		}
		p.runWorker(w)
	}
	// Every record has reached a handler before the group can be empty, so
	// the group is only asked after that.
	select {
	case <-allHandled:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	err = waitFor(ctx, start, "records settled", func() (int, int, error) {
		info, err := p.client.GetStream(ctx, benchStream)
		if err != nil {
			return 0, 0, fmt.Errorf("stream info: %w", err)
		}
		for _, g := range info.Groups {
			if g.Name == benchGroup {
				return o.records - int(g.Lag+g.Pending), o.records, nil
			}
		}
		return 0, 0, fmt.Errorf("group %s is missing from stream %s", benchGroup, benchStream)
	})
	if err != nil {
		return 0, 0, err
	}
	return perSecond(o.records, time.Since(start)), int(handled.Load()) - o.records, nil
}
