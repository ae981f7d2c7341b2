package service_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/kafka"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Benchmark shape: records per run, records per append and per group read,
// partitions, concurrent appenders and consumers.
const (
	benchRecords    = 100_000
	benchBatch      = 1000
	benchRead       = 1000
	benchPartitions = 4
	benchWorkers    = 3
	benchPayload    = `{"type":"signup","user":"u-123456","plan":"pro","ts":1700000000000}`
)

// BenchmarkThroughput measures, against one embedded broker, the raw log
// (produce in batches of benchBatch, consume every partition with a plain
// client) and the stream layer (Append batches, GroupRead of benchRead plus
// Ack by concurrent consumers), in records per second, so the layer's
// overhead is a ratio. Each iteration is a whole run; use -benchtime=1x.
func BenchmarkThroughput(b *testing.B) {
	for range b.N {
		e := newEnv(b)
		rawProduce, rawConsume := benchRaw(b, e)
		appendRate, consumeRate := benchStreams(b, e)
		b.ReportMetric(rawProduce, "raw-produce-rec/s")
		b.ReportMetric(rawConsume, "raw-consume-rec/s")
		b.ReportMetric(appendRate, "append-rec/s")
		b.ReportMetric(consumeRate, "group-consume-rec/s")
		b.ReportMetric(appendRate/rawProduce, "append/raw")
		b.ReportMetric(consumeRate/rawConsume, "consume/raw")
	}
}

func benchRaw(b *testing.B, e *env) (produce, consume float64) {
	ctx := context.Background()
	cl, err := kafka.NewClient(e.broker.Kafka())
	require.NoError(b, err)
	defer cl.Close()
	const topic = "bench.raw"
	_, err = kadm.NewClient(cl).CreateTopic(ctx, benchPartitions, -1, nil, topic)
	require.NoError(b, err)

	start := time.Now()
	var wg sync.WaitGroup
	for w := range benchWorkers {
		wg.Go(func() {
			for i := w * benchBatch; i < benchRecords; i += benchWorkers * benchBatch {
				batch := make([]*kgo.Record, benchBatch)
				for j := range batch {
					batch[j] = &kgo.Record{Topic: topic, Value: []byte(benchPayload)}
				}
				if err := cl.ProduceSync(ctx, batch...).FirstErr(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	produce = benchRecords / time.Since(start).Seconds()

	reader, err := kafka.NewClient(e.broker.Kafka(), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(b, err)
	defer reader.Close()
	start = time.Now()
	for n := 0; n < benchRecords; {
		fs := reader.PollFetches(ctx)
		require.NoError(b, fs.Err0())
		n += fs.NumRecords()
	}
	return produce, benchRecords / time.Since(start).Seconds()
}

func benchStreams(b *testing.B, e *env) (appendRate, consumeRate float64) {
	ctx := context.Background()
	r := e.start(b, e.config())
	c := r.client
	ns := namespace()
	createStream(b, c, ns, "bench", benchPartitions)
	createGroup(b, c, ns, "bench", "g", "-", 0)

	start := time.Now()
	var wg sync.WaitGroup
	for w := range benchWorkers {
		wg.Go(func() {
			for i := w * benchBatch; i < benchRecords; i += benchWorkers * benchBatch {
				req := &flov1.AppendRequest{Namespace: ns, Stream: "bench", Records: make([]*flov1.AppendRecord, benchBatch)}
				for j := range req.Records {
					req.Records[j] = &flov1.AppendRecord{Payload: []byte(benchPayload)}
				}
				if _, err := c.Append(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	appendRate = benchRecords / time.Since(start).Seconds()

	var acked atomic.Int64
	start = time.Now()
	for w := range benchWorkers {
		wg.Go(func() {
			for acked.Load() < benchRecords {
				resp, err := c.GroupRead(ctx, &flov1.GroupReadRequest{
					Namespace: ns, Stream: "bench", Group: "g", Consumer: string(rune('a' + w)), Count: benchRead, BlockMs: 100,
				})
				if err != nil {
					b.Error(err)
					return
				}
				if len(resp.GetRecords()) == 0 {
					continue
				}
				a, err := c.Ack(ctx, &flov1.AckRequest{Namespace: ns, Stream: "bench", Group: "g", Ids: ids(resp.GetRecords())})
				if err != nil {
					b.Error(err)
					return
				}
				acked.Add(int64(a.GetAcked()))
			}
		})
	}
	wg.Wait()
	return appendRate, benchRecords / time.Since(start).Seconds()
}
