package kafka_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
)

// A producer made for a payload limit sends a record carrying a payload of
// that size, which a client with the default batches refuses; a limit whose
// records the topics could not take is refused up front.
func TestNewProducerIsSizedForThePayloadLimit(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	const limit = 2 << 20
	record := func() *kgo.Record {
		return &kgo.Record{Topic: "big", Key: []byte("k"), Value: bytes.Repeat([]byte("p"), limit+1<<10)}
	}

	producer, err := kafka.NewProducer(t.Context(), broker.Kafka(), 1, limit, []string{"big"})
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	require.NoError(t, producer.ProduceSync(t.Context(), record()).FirstErr())

	plain, err := kafka.NewClient(broker.Kafka())
	require.NoError(t, err)
	t.Cleanup(plain.Close)
	require.ErrorIs(t, plain.ProduceSync(t.Context(), record()).FirstErr(), kerr.MessageTooLarge)

	for _, bad := range []int{0, -1, kafka.MaxRecordBytes - kafka.RecordEnvelopeBytes + 1} {
		_, err := kafka.NewProducer(t.Context(), broker.Kafka(), 1, bad, []string{"big"})
		require.ErrorContains(t, err, "FLO_MAX_PAYLOAD_BYTES must be between 1 and")
	}
	largest, err := kafka.NewProducer(t.Context(), broker.Kafka(), 1, kafka.MaxRecordBytes-kafka.RecordEnvelopeBytes, []string{"big"})
	require.NoError(t, err)
	largest.Close()
}
