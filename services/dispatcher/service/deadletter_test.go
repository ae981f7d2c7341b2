package service_test

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestPoisonCommands produces records straight to the commands topic that
// the intake cannot take, and checks that each lands in the dead-letter topic
// while the records behind it, in its partition and in others sharing its
// transaction, are enqueued; and that a command sent to another partition
// than its task's is moved there.
func TestPoisonCommands(t *testing.T) {
	t.Parallel()
	e, _, brokers := startEnvOn(t)
	waitDeadLetter := func(t *testing.T, match func(*kafka.DeadLetter) bool) *kafka.DeadLetter {
		t.Helper()
		return harness.WaitDeadLetter(t, brokers, kafka.CommandsTopic, match)
	}

	t.Run("garbage and impossible", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		e.register(t, ns, "work", nil)
		key := "k-" + ns
		garbage := []byte("not protobuf \xff " + ns)
		require.NoError(t, e.producer.ProduceSync(t.Context(), &kgo.Record{Topic: kafka.CommandsTopic, Key: []byte(key), Value: garbage}).FirstErr())
		badID := &eventsv1.InvokeTask{TaskId: "task-" + ns, Namespace: ns, Action: "work"}
		badNamespace := &eventsv1.InvokeTask{TaskId: uuid.NewString(), Namespace: ns + "/nested", Action: "work"}
		e.produce(t, key, nil, badID, badNamespace)
		ids := e.produceOrdinary(t, ns, 20)

		got := waitDeadLetter(t, func(l *kafka.DeadLetter) bool { return string(l.Value) == string(garbage) })
		require.Equal(t, kafka.CommandsTopic, got.SourceTopic)
		require.Equal(t, "flo-dispatcher", got.Group)
		require.Contains(t, got.Error, "decode InvokeTask")
		require.Equal(t, key, string(got.Key))
		got = waitDeadLetter(t, invocationOf(badID.GetTaskId()))
		require.Contains(t, got.Error, "task_id")
		got = waitDeadLetter(t, invocationOf(badNamespace.GetTaskId()))
		require.Contains(t, got.Error, "namespace")
		for _, id := range ids {
			e.waitTask(t, ns, id)
		}
	})

	t.Run("NUL in the idempotency key", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		e.register(t, ns, "work", nil)
		// Postgres text cannot hold NUL: the intake transaction this record
		// shares with other partitions fails.
		nul := &eventsv1.InvokeTask{Namespace: ns, Action: "work", IdempotencyKey: "key\u0000" + ns}
		e.produce(t, "", nil, nul)
		ids := e.produceOrdinary(t, ns, 20)

		got := waitDeadLetter(t, invocationOf(nul.GetTaskId()))
		require.Equal(t, "flo-dispatcher", got.Group)
		for _, id := range ids {
			e.waitTask(t, ns, id)
		}
		claimed := e.claim(t, ns, []string{"work"}, 100, waitFor, 0)
		require.Len(t, claimed, len(ids))
		for _, a := range claimed {
			require.Empty(t, e.report(t, ns, completed(a, "ok", "")))
		}
		for _, id := range ids {
			e.waitStatus(t, ns, id, stCompleted)
		}
		_, err := e.client.GetTask(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: nul.GetTaskId()})
		requireCode(t, codes.NotFound, err, "not found")
	})

	t.Run("keyed by something else", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		e.register(t, ns, "work", nil)
		// A command keyed by anything but its task id may land in a
		// partition whose owner could never find the task again by its id:
		// that owner moves it to its task's partition, and the others go on.
		var stray *eventsv1.InvokeTask
		for stray == nil {
			c := &eventsv1.InvokeTask{TaskId: uuid.NewString(), Namespace: ns, Action: "work", Payload: []byte(`"once"`)}
			if kafka.PartitionOf("stray-"+ns, partitions) != kafka.PartitionOf(c.TaskId, partitions) {
				stray = c
			}
		}
		e.produce(t, "stray-"+ns, nil, stray)
		ids := e.produceOrdinary(t, ns, 5)
		task := e.waitTask(t, ns, stray.GetTaskId())
		require.Equal(t, []byte(`"once"`), task.GetPayload())
		for _, id := range ids {
			e.waitTask(t, ns, id)
		}

		// The same command keyed by its id is the same task: it is not
		// created twice.
		e.produce(t, "", nil, stray)
		after := &eventsv1.InvokeTask{TaskId: samePartition(stray.GetTaskId()), Namespace: ns, Action: "work"}
		e.produce(t, "", nil, after)
		e.events.waitEvents(t, after.GetTaskId(), evCreated)
		require.Equal(t, []eventsv1.TaskEventType{evCreated}, types(e.events.of(stray.GetTaskId())))
	})
}

// produceOrdinary invokes n tasks of action "work" in ns, each keyed by its
// task id, as every producer of commands does.
func (e *env) produceOrdinary(t *testing.T, ns string, n int) []string {
	t.Helper()
	cmds := make([]*eventsv1.InvokeTask, n)
	for i := range cmds {
		cmds[i] = &eventsv1.InvokeTask{Namespace: ns, Action: "work", Payload: fmt.Appendf(nil, "%d", i)}
	}
	e.produce(t, "", nil, cmds...)
	ids := make([]string, n)
	for i, c := range cmds {
		ids[i] = c.GetTaskId()
	}
	return ids
}

// invocationOf matches the dead-lettered InvokeTask of a task id.
func invocationOf(taskID string) func(*kafka.DeadLetter) bool {
	return func(l *kafka.DeadLetter) bool {
		var cmd eventsv1.InvokeTask
		return proto.Unmarshal(l.Value, &cmd) == nil && cmd.GetTaskId() == taskID
	}
}

// A dead letter from before log-first dispatch (a row of partition -1, which
// no record has changed since) is requeued from the view, even once the
// partition's view has moved past offsets a requeue checks rows against.
func TestDeadLetterFromBeforeLogFirstDispatchIsRequeued(t *testing.T) {
	t.Parallel()
	e, dbURL, _ := startEnvOn(t)
	db, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close(t.Context()) })
	ns := e.namespace(t)
	e.register(t, ns, "work", nil)

	// Every partition's view moves on: ordinary tasks done and written.
	ids := e.produceOrdinary(t, ns, 40)
	for _, id := range ids {
		e.waitTask(t, ns, id)
	}
	claimed := e.claim(t, ns, []string{"work"}, int32(len(ids)), waitFor, 0)
	require.Len(t, claimed, len(ids))
	for _, a := range claimed {
		require.Empty(t, e.report(t, ns, completed(a, "ok", "")))
	}
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(t.Context(), `SELECT count(*) FROM dispatcher.view_offsets WHERE events_offset > 0`).Scan(&n))
		return n == partitions
	}, waitFor, tick, "the view never reached every partition")

	old := uuid.New()
	_, err = db.Exec(t.Context(), `
INSERT INTO dispatcher.tasks (id, namespace, action, state, payload, attempt, max_attempts, timeout_ms, backoff_kind,
	backoff_initial_ms, backoff_max_ms, backoff_multiplier, created_at, run_at, finished_at, error)
VALUES ($1, $2, 'work', 'dead_lettered', '"old"', 3, 3, 1000, 'constant', 10, 10, 1, now(), now(), now(), 'gave up')`, old, ns)
	require.NoError(t, err)

	task, err := e.client.RequeueDeadLetter(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: old.String()})
	require.NoError(t, err)
	require.Equal(t, flov1.TaskStatus_TASK_STATUS_QUEUED, task.GetStatus())
	got := e.claimOne(t, ns, "work", 0)
	require.Equal(t, old.String(), got.GetTaskId())
	require.Equal(t, `"old"`, string(got.GetPayload()))
}

// startEnvOn starts an env on a fresh database and broker, and returns the
// database's URL and the broker's addresses too.
func startEnvOn(t *testing.T) (e *env, dbURL string, brokers []string) {
	t.Helper()
	dbURL = harness.NewDatabase(t)
	brokers = harness.NewBroker(t).Addrs()
	r := startReplica(t, dbURL, brokers)
	e = &env{svc: r.svc, client: r.client, producer: newProducer(t, brokers), events: newEventLog()}
	e.events.start(t, brokers)
	return e, dbURL, brokers
}
