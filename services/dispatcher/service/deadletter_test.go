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
// transaction, are enqueued.
func TestPoisonCommands(t *testing.T) {
	t.Parallel()
	dbURL := harness.NewDatabase(t)
	broker := harness.NewBroker(t)
	r := startReplica(t, dbURL, broker.Addrs())
	e := &env{svc: r.svc, client: r.client, producer: newProducer(t, broker.Addrs()), events: newEventLog()}
	e.events.start(t, broker.Addrs())
	waitDeadLetter := func(t *testing.T, match func(*kafka.DeadLetter) bool) *kafka.DeadLetter {
		t.Helper()
		return harness.WaitDeadLetter(t, broker.Addrs(), commandsTopic, match)
	}

	t.Run("garbage and impossible", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		e.register(t, ns, "work", nil)
		key := "k-" + ns
		garbage := []byte("not protobuf \xff " + ns)
		require.NoError(t, e.producer.ProduceSync(t.Context(), &kgo.Record{Topic: commandsTopic, Key: []byte(key), Value: garbage}).FirstErr())
		badID := &eventsv1.InvokeTask{TaskId: "task-" + ns, Namespace: ns, Action: "work"}
		badNamespace := &eventsv1.InvokeTask{TaskId: uuid.NewString(), Namespace: ns + "/nested", Action: "work"}
		e.produce(t, key, nil, badID, badNamespace)
		ids := e.produceOrdinary(t, ns, key, 20)

		got := waitDeadLetter(t, func(l *kafka.DeadLetter) bool { return string(l.Value) == string(garbage) })
		require.Equal(t, commandsTopic, got.SourceTopic)
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
		ids := e.produceOrdinary(t, ns, "", 20)

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

	t.Run("replayed once fixed", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		e.register(t, ns, "fragile", nil)
		e.register(t, ns, "work", nil)
		// The cause: the store refuses this namespace's fragile tasks for a
		// while, as a bad migration or a full disk would.
		conn, err := pgx.Connect(t.Context(), dbURL)
		require.NoError(t, err)
		defer func() { require.NoError(t, conn.Close(t.Context())) }()
		trigger := pgx.Identifier{"refuse_" + ns}.Sanitize()
		_, err = conn.Exec(t.Context(), fmt.Sprintf(`
			CREATE FUNCTION dispatcher.%[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'tasks of %% are refused for maintenance', NEW.action; END $$;
			CREATE TRIGGER %[1]s BEFORE INSERT ON dispatcher.tasks FOR EACH ROW
			WHEN (NEW.action = 'fragile' AND NEW.namespace = '%[2]s') EXECUTE FUNCTION dispatcher.%[1]s()`, trigger, ns))
		require.NoError(t, err)

		key := "r-" + ns
		fragile := &eventsv1.InvokeTask{Namespace: ns, Action: "fragile", Payload: []byte(`"once"`)}
		e.produce(t, key, nil, fragile)
		ids := e.produceOrdinary(t, ns, key, 5)
		got := waitDeadLetter(t, invocationOf(fragile.GetTaskId()))
		require.Contains(t, got.Error, "refused for maintenance")
		for _, id := range ids {
			e.waitTask(t, ns, id)
		}
		_, err = e.client.GetTask(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: fragile.GetTaskId()})
		requireCode(t, codes.NotFound, err, "not found")

		// The fix, then the replay `flo dlq replay` makes.
		_, err = conn.Exec(t.Context(), fmt.Sprintf(`DROP TRIGGER %[1]s ON dispatcher.tasks; DROP FUNCTION dispatcher.%[1]s()`, trigger))
		require.NoError(t, err)
		dlq := kafka.DeadLetterTopic(commandsTopic)
		replayed, err := kafka.ReplayDeadLetters(t.Context(), broker.Kafka(), dlq, kafka.Selection{Offsets: []int64{got.Offset}})
		require.NoError(t, err)
		require.Len(t, replayed, 1)
		task := e.waitTask(t, ns, fragile.GetTaskId())
		require.Equal(t, []byte(`"once"`), task.GetPayload())
		e.events.waitEvents(t, fragile.GetTaskId(), evCreated)
		_, err = kafka.ReplayDeadLetters(t.Context(), broker.Kafka(), dlq, kafka.Selection{Offsets: []int64{got.Offset}})
		require.ErrorContains(t, err, "was replayed at")
	})
}

// produceOrdinary invokes n tasks of action "work" in ns, with key (one
// partition) or each with its own (many partitions) when key is empty.
func (e *env) produceOrdinary(t *testing.T, ns, key string, n int) []string {
	t.Helper()
	cmds := make([]*eventsv1.InvokeTask, n)
	for i := range cmds {
		cmds[i] = &eventsv1.InvokeTask{Namespace: ns, Action: "work", Payload: fmt.Appendf(nil, "%d", i)}
	}
	e.produce(t, key, nil, cmds...)
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
