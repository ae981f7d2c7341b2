package service_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Another producer takes a partition's transactional id, as the next owner
// does while this replica is paused past its session. The replica's next
// batch there fails, and it must not take the id back on its own (franz-go
// re-initializes a producer whose transaction failed, naming its old epoch,
// which the embedded broker accepts). While the group still assigns it the
// partition, it takes the id back after a session, with a new producer: the
// fenced one stays failed for good.
func TestAFencedPartitionDoesNotTakeItsIDBack(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	r := startReplica(t, harness.NewDatabase(t), broker.Addrs())
	e := &env{svc: r.svc, client: r.client, producer: newProducer(t, broker.Addrs())}
	ns := e.namespace(t)
	e.register(t, ns, "work", nil)
	id := e.invoke(t, ns, "work", `{}`)
	leased := e.claimOne(t, ns, "work", waitFor*3)
	require.Equal(t, id, leased.GetTaskId())

	part := kafka.PartitionOf(id, partitions)
	usurper, err := kgo.NewClient(kgo.SeedBrokers(broker.Addrs()...),
		kgo.TransactionalID(kafka.DispatcherGroup+"-p"+strconv.Itoa(int(part))), kgo.ProducerLinger(0))
	require.NoError(t, err)
	t.Cleanup(usurper.Close)
	_, _, err = usurper.ProducerID(t.Context())
	require.NoError(t, err)

	// The report's batch is fenced: the call fails.
	_, err = e.client.Report(t.Context(), &dispatcherv1.ReportRequest{Namespace: ns, WorkerId: "w1",
		Reports: []*dispatcherv1.Report{completed(leased, `"fenced"`, "")}})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	// The usurper still holds the id: its transaction commits.
	require.NoError(t, kafka.EnsureTopics(t.Context(), e.producer, 1, "usurped"))
	require.NoError(t, usurper.BeginTransaction())
	require.NoError(t, usurper.ProduceSync(t.Context(), &kgo.Record{Topic: "usurped", Value: []byte("x")}).FirstErr())
	require.NoError(t, usurper.EndTransaction(t.Context(), kgo.TryCommit), "the fenced replica took the transactional id back")

	// The group still assigns the partition here: after a session the
	// replica takes the id back, rebuilds, and the worker's report lands.
	require.Eventually(t, func() bool {
		resp, err := e.client.Report(t.Context(), &dispatcherv1.ReportRequest{Namespace: ns, WorkerId: "w1",
			Reports: []*dispatcherv1.Report{completed(leased, `"done"`, "")}})
		return err == nil && len(resp.GetRejectedTaskIds()) == 0
	}, 3*waitFor, tick)
	task := e.waitStatus(t, ns, id, flov1.TaskStatus_TASK_STATUS_COMPLETED)
	require.Equal(t, `"done"`, string(task.GetResult()))
}
