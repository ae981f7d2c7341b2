package service_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// produceMany writes n invocations of ns/action in batches and returns their ids.
func produceMany(t testing.TB, producer *kgo.Client, ns, action string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	recs := make([]*kgo.Record, 0, n)
	for i := range ids {
		ids[i] = uuid.NewString()
		value, err := proto.Marshal(&eventsv1.InvokeTask{EventId: uuid.NewString(), TaskId: ids[i], Namespace: ns, Action: action, Payload: []byte(`{}`), InvokedAt: timestamppb.Now()})
		require.NoError(t, err)
		recs = append(recs, &kgo.Record{Topic: kafka.CommandsTopic, Key: []byte(ids[i]), Value: value})
	}
	require.NoError(t, producer.ProduceSync(t.Context(), recs...).FirstErr())
	return ids
}

// drain claims from every replica at once until want distinct tasks were
// handed out, completing each through the next replica, and fails if any
// task is handed out twice.
func drain(t *testing.T, replicas []*replica, ns, action string, want int) {
	t.Helper()
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
		dup  []string
	)
	deadline := time.Now().Add(time.Minute)
	var wg sync.WaitGroup
	for i, r := range replicas {
		next := replicas[(i+1)%len(replicas)]
		wg.Go(func() {
			for time.Now().Before(deadline) {
				mu.Lock()
				finished := len(seen) >= want
				mu.Unlock()
				if finished {
					return
				}
				resp, err := r.client.Claim(t.Context(), &dispatcherv1.ClaimRequest{Namespace: ns, Slots: []*dispatcherv1.ClaimSlot{{WorkerId: uuid.NewString(), Count: 50}}, Actions: []string{action}, WaitMs: 200})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				reports := make([]*dispatcherv1.Report, 0, len(resp.GetTasks()))
				mu.Lock()
				for _, a := range resp.GetTasks() {
					if seen[a.GetTaskId()] {
						dup = append(dup, a.GetTaskId())
					}
					seen[a.GetTaskId()] = true
					reports = append(reports, completed(a, `"ok"`, ""))
				}
				mu.Unlock()
				if len(reports) == 0 {
					continue
				}
				rep, err := next.client.Report(t.Context(), &dispatcherv1.ReportRequest{Namespace: ns, WorkerId: "w", Reports: reports})
				if err != nil {
					t.Errorf("report: %v", err)
					return
				}
				if len(rep.GetRejectedTaskIds()) > 0 {
					t.Errorf("reports rejected: %v", rep.GetRejectedTaskIds())
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, dup, "tasks handed out twice")
	require.Len(t, seen, want)
}

// Two replicas share the database and the consumer group: every task is
// created once, handed out once, and completes, whichever replica claims it.
func TestReplicasShareTheWork(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	a := startReplica(t, dbURL, broker.Addrs())
	b := startReplica(t, dbURL, broker.Addrs())
	_, err := a.client.RegisterAction(t.Context(), &flov1.RegisterActionRequest{Namespace: "default", Name: "shared"})
	require.NoError(t, err)

	ids := produceMany(t, newProducer(t, broker.Addrs()), "default", "shared", 500)
	drain(t, []*replica{a, b}, "default", "shared", len(ids))
	for _, id := range ids {
		task, err := b.client.GetTask(t.Context(), &flov1.GetTaskRequest{Namespace: "default", TaskId: id})
		require.NoError(t, err)
		require.Equal(t, stCompleted, task.GetStatus())
		require.Equal(t, int32(1), task.GetAttempt())
	}
}

// Stopping the dispatcher in the middle of a stream of invocations and
// starting it again loses none of them.
func TestRestartLosesNothing(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	first := startReplica(t, dbURL, broker.Addrs())
	_, err := first.client.RegisterAction(t.Context(), &flov1.RegisterActionRequest{Namespace: "default", Name: "survivor"})
	require.NoError(t, err)

	producer := newProducer(t, broker.Addrs())
	var ids []string
	for range 4 {
		ids = append(ids, produceMany(t, producer, "default", "survivor", 500)...)
	}
	first.stop()

	second := startReplica(t, dbURL, broker.Addrs())
	drain(t, []*replica{second}, "default", "survivor", len(ids))
	for _, id := range ids {
		task, err := second.client.GetTask(t.Context(), &flov1.GetTaskRequest{Namespace: "default", TaskId: id})
		require.NoError(t, err)
		require.Equal(t, stCompleted, task.GetStatus())
	}
}
