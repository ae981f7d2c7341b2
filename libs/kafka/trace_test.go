package kafka_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/telemetry"
)

// While spans are recorded, each consumed batch's span continues its
// record's trace (one record) or links the traces of its records (more);
// every producer's span is named by one of them. Not parallel: it installs
// the process's span recorder.
func TestBatchSpansNameTheirRecordsTraces(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	rec := tracetest.NewSpanRecorder()
	tel, err := telemetry.Setup(t.Context(), "test", telemetry.WithSpanProcessor(rec))
	require.NoError(t, err)
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()

	broker := harness.NewBroker(t)
	prod := newProducer(t, broker.Addrs())
	require.NoError(t, kafka.EnsureTopics(t.Context(), prod, 1, "traced"))
	producers := map[trace.SpanID]bool{}
	var records []*kgo.Record
	for i := range 3 {
		ctx, span := otel.Tracer("test").Start(t.Context(), "produce")
		r := &kgo.Record{Topic: "traced", Key: []byte("k"), Value: []byte(strconv.Itoa(i))}
		kafka.InjectTrace(ctx, r)
		span.End()
		producers[span.SpanContext().SpanID()] = false
		records = append(records, r)
	}
	require.NoError(t, prod.ProduceSync(t.Context(), records...).FirstErr())

	c, err := kafka.NewConsumer(broker.Kafka(), "linker", []string{"traced"}, func(context.Context, []*kgo.Record) error { return nil }, quiet)
	require.NoError(t, err)
	run(t, c.Run)
	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			if s.Name() != "process traced" {
				continue
			}
			if _, ok := producers[s.Parent().SpanID()]; ok {
				producers[s.Parent().SpanID()] = true
			}
			for _, l := range s.Links() {
				if _, ok := producers[l.SpanContext.SpanID()]; ok {
					producers[l.SpanContext.SpanID()] = true
				}
			}
		}
		for _, named := range producers {
			if !named {
				return false
			}
		}
		return true
	}, waitFor, tick, "producers named by a batch span: %v", producers)
}
