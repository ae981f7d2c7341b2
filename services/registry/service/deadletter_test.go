package service_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestPoisonTaskEvents produces records straight to the task events topic
// that the tally cannot count, and checks that each lands in the dead-letter
// topic while the events behind it are counted.
func TestPoisonTaskEvents(t *testing.T) {
	t.Parallel()
	e := startEnv(t, nil)
	ns := namespace()
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "w1"})
	const completed = eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED

	garbage := []byte("not protobuf \xff")
	require.NoError(t, e.producer.ProduceSync(t.Context(), &kgo.Record{Topic: kafka.TaskOutcomesTopic, Key: []byte("k"), Value: garbage}).FirstErr())
	impossible := taskEvent(ns, "w1\u0000", "send", completed)
	e.produceTaskEvents(t, "k", impossible)
	for _, key := range []string{"k", "k2"} {
		for range 5 {
			e.produceTaskEvents(t, key, taskEvent(ns, "w1", "send", completed))
		}
	}

	brokers := e.cfg.Kafka.Brokers
	got := harness.WaitDeadLetter(t, brokers, kafka.TaskOutcomesTopic, func(l *kafka.DeadLetter) bool { return string(l.Value) == string(garbage) })
	require.Equal(t, "flo-registry", got.Group)
	require.Equal(t, kafka.TaskOutcomesTopic, got.SourceTopic)
	require.Contains(t, got.Error, "decode TaskEvent")
	got = harness.WaitDeadLetter(t, brokers, kafka.TaskOutcomesTopic, func(l *kafka.DeadLetter) bool {
		var ev eventsv1.TaskEvent
		return proto.Unmarshal(l.Value, &ev) == nil && ev.GetEventId() == impossible.GetEventId()
	})
	require.Contains(t, got.Error, "worker_id")
	require.Eventually(t, func() bool { return getWorker(t, e.client, ns, "w1").GetTasksCompleted() == 10 }, waitFor, tick)
}
