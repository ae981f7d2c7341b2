package kafka_test

import (
	"context"
	"reflect"
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

// A TraceMemo gives records with the same trace headers one trace context, and
// a record with other headers, or none, its own.
func TestTraceMemoSharesOneBatchsContext(t *testing.T) {
	const first = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const second = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	traced := func(headers ...string) *kgo.Record {
		r := &kgo.Record{}
		for i := 0; i < len(headers); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
		}
		return r
	}
	var m kafka.TraceMemo
	a := m.Valid(traced("traceparent", first, "flo-moved-from", "3"))
	require.Equal(t, map[string]string{"traceparent": first}, a)
	b := m.Valid(traced("traceparent", first))
	require.Equal(t, reflect.ValueOf(a).UnsafePointer(), reflect.ValueOf(b).UnsafePointer(), "the same headers share the map")

	require.Equal(t, map[string]string{"traceparent": second}, m.Valid(traced("traceparent", second)))
	require.Equal(t, map[string]string{"traceparent": second, "tracestate": "k=v"}, m.Valid(traced("traceparent", second, "tracestate", "k=v")))
	require.Equal(t, map[string]string{"traceparent": second}, m.Valid(traced("traceparent", second)), "a tracestate dropped is another context")
	require.Nil(t, m.Valid(traced()), "no headers: no context")
	require.Nil(t, m.Valid(traced("traceparent", "00-zz")), "an invalid traceparent: no context")
	require.Equal(t, map[string]string{"traceparent": first}, m.Valid(traced("traceparent", first)))
}
