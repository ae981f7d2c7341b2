package service_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/internal/runner"
)

// TestPoisonTaskEvents produces records straight to the task events topic
// that the runner cannot apply, and checks that each lands in the
// dead-letter topic while the runs whose events come behind complete.
func TestPoisonTaskEvents(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	ns := e.namespace(t)
	e.worker(t, ns, script{"step": func(*flov1.TaskAssignment) reply { return ok(`{"ok":true}`) }})
	e.create(t, ns, `kind: Workflow
name: three
version: "1"
start:
  run: "@actions/step"
  transitions:
    success: second
steps:
  second:
    run: "@actions/step"
    transitions:
      success: third
  third:
    run: "@actions/step"
    transitions:
      success: flo.Completed
`)

	producer, err := kafka.NewClient(config.Kafka{Brokers: e.brokers})
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	garbage := []byte("not protobuf \xff")
	impossible := &eventsv1.TaskEvent{
		EventId: "impossible", Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED,
		Namespace: ns, Action: "step", Origin: "workflow:not-a-run:token",
	}
	value, err := proto.Marshal(impossible)
	require.NoError(t, err)
	require.NoError(t, producer.ProduceSync(t.Context(),
		&kgo.Record{Topic: kafka.TaskOutcomesTopic, Key: []byte("k"), Value: garbage},
		&kgo.Record{Topic: kafka.TaskOutcomesTopic, Key: []byte("k"), Value: value}).FirstErr())

	runs := make([]string, 10)
	for i := range runs {
		runs[i] = e.start(t, ns, "three", `{}`, "")
	}
	for _, id := range runs {
		e.waitRun(t, ns, id, stCompleted)
	}
	got := harness.WaitDeadLetter(t, e.brokers, kafka.TaskOutcomesTopic, func(l *kafka.DeadLetter) bool { return string(l.Value) == string(garbage) })
	require.Equal(t, runner.ConsumerGroup, got.Group)
	require.Contains(t, got.Error, "decode TaskEvent")
	got = harness.WaitDeadLetter(t, e.brokers, kafka.TaskOutcomesTopic, func(l *kafka.DeadLetter) bool { return string(l.Value) == string(value) })
	require.Equal(t, runner.ConsumerGroup, got.Group)
	require.Contains(t, got.Error, "names no run")
}
