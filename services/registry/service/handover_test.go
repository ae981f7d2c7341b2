package service_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/registry/internal/tally"
	"github.com/razorbill/flo/services/registry/service"
)

// The registry's first start after the outcomes topic came, beside a
// dispatcher of the version before it: it is not ready and counts nothing
// until that dispatcher is gone, then counts the outcomes its earlier
// version left unread in the task events (the only place the earlier
// dispatcher wrote them), and after them the outcomes topic's.
func TestUpgradeCountsWhatEarlierDispatchersLeftInTheTaskEvents(t *testing.T) {
	t.Parallel()
	ns := namespace()
	const completed = eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED
	var (
		earlier *kgo.Client
		events  func(evs ...*eventsv1.TaskEvent)
	)
	e := startEnv(t, func(cfg *service.Config) {
		producer := newProducer(t, cfg.Kafka.Brokers)
		require.NoError(t, kafka.EnsureTopics(t.Context(), producer, 1, kafka.CommandsTopic, kafka.TaskEventsTopic, kafka.TaskOutcomesTopic))
		events = func(evs ...*eventsv1.TaskEvent) {
			recs := make([]*kgo.Record, len(evs))
			for i, ev := range evs {
				value, err := proto.Marshal(ev)
				require.NoError(t, err)
				recs[i] = &kgo.Record{Topic: kafka.TaskEventsTopic, Key: []byte("k"), Value: value}
			}
			require.NoError(t, producer.ProduceSync(t.Context(), recs...).FirstErr())
		}
		// The registry's earlier version counted the first event.
		events(taskEvent(ns, "w1", "send", completed))
		var handled kadm.Offsets
		handled.Add(kadm.Offset{Topic: kafka.TaskEventsTopic, Partition: 0, At: 1, LeaderEpoch: -1})
		resp, err := kadm.NewClient(producer).CommitOffsets(t.Context(), tally.ConsumerGroup, handled)
		require.NoError(t, err)
		require.NoError(t, resp.Error())
		// A dispatcher of the earlier version: franz-go's default client id.
		earlier, err = kgo.NewClient(kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.ConsumerGroup(kafka.DispatcherGroup), kgo.ConsumeTopics(kafka.CommandsTopic))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			members, err := kafka.DispatcherMembers(t.Context(), kadm.NewClient(producer))
			return err == nil && len(members) == 1
		}, waitFor, tick)
	})
	readyz := func() (int, string) { return harness.HTTPGet(t, "http://"+e.svc.HTTPAddr()+"/readyz") }
	require.Eventually(t, func() bool {
		code, body := readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for the dispatchers of an earlier version (1: ") && strings.Contains(body, kafka.DispatcherGroup)
	}, waitFor, tick)

	// While it waits, the earlier dispatcher ends two more attempts of w1's
	// tasks; the events of a lease are not counted.
	register(t, e.client, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: "w1", Processes: []*flov1.WorkerProcess{{Name: "send"}}})
	events(taskEvent(ns, "w1", "send", eventsv1.TaskEventType_TASK_EVENT_TYPE_STARTED),
		taskEvent(ns, "w1", "send", completed),
		taskEvent(ns, "w1", "send", eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED))
	require.Zero(t, getWorker(t, e.client, ns, "w1").GetTasksCompleted())

	earlier.Close()
	// Ready once what was left is counted.
	require.Eventually(t, func() bool { code, _ := readyz(); return code == http.StatusOK }, waitFor, tick)
	w1 := getWorker(t, e.client, ns, "w1")
	require.Equal(t, [2]int64{1, 1}, [2]int64{w1.GetTasksCompleted(), w1.GetTasksFailed()}, "counted from the task events: %v", w1)
	e.produceTaskEvents(t, "k", taskEvent(ns, "w1", "send", completed))
	require.Eventually(t, func() bool { return getWorker(t, e.client, ns, "w1").GetTasksCompleted() == 2 }, waitFor, tick)
}
