package service_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/view"
	"github.com/razorbill/flo/services/dispatcher/service"
)

// Raising the partition count moves most task ids to other partitions. With
// the dispatchers stopped, Repartition brings the view up to the log, keys
// it by the new count and grows both topics; the replica started after it
// hands out every queued task once, keeps leases, delays and dead letters,
// and moves commands sent under the old count (waiting in the log, or sent
// by a producer that has not seen the new count) to their tasks' partitions.
func TestRepartitionKeepsEveryTask(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	cfg := service.Config{Postgres: config.Postgres{URL: dbURL}, Kafka: config.Kafka{Brokers: broker.Addrs(), Partitions: partitions}}
	log := slog.New(slog.DiscardHandler)
	const grown = 2 * partitions

	first := startReplica(t, dbURL, broker.Addrs())
	e := &env{svc: first.svc, client: first.client, producer: newProducer(t, broker.Addrs())}
	ns := e.namespace(t)
	e.register(t, ns, "work", &flov1.RegisterActionRequest{MaxAttempts: 1})

	// Tasks in every state: held by a worker, dead, done, due soon, due
	// much later, and queued.
	var leased []*flov1.TaskAssignment
	for range 6 {
		e.invoke(t, ns, "work", `{}`)
		leased = append(leased, e.claimOne(t, ns, "work", time.Hour))
	}
	dead := e.invoke(t, ns, "work", `{}`)
	require.Empty(t, e.report(t, ns, failed(e.claimOne(t, ns, "work", time.Minute), "boom", true, false)))
	done := e.invoke(t, ns, "work", `{}`)
	require.Empty(t, e.report(t, ns, completed(e.claimOne(t, ns, "work", time.Minute), `"done"`, "")))
	soon, later := time.Now().Add(3*time.Second), time.Now().Add(time.Hour)
	var dueSoon []string
	for range 5 {
		id := uuid.NewString()
		e.produce(t, "", nil, &eventsv1.InvokeTask{TaskId: id, Namespace: ns, Action: "work", RunAt: timestamppb.New(soon)})
		dueSoon = append(dueSoon, id)
	}
	dueLater := uuid.NewString()
	e.produce(t, "", nil, &eventsv1.InvokeTask{TaskId: dueLater, Namespace: ns, Action: "work", RunAt: timestamppb.New(later)})
	queued := produceMany(t, e.producer, ns, "work", 40)
	for _, id := range append(slices.Clone(dueSoon), append(queued, dueLater)...) {
		e.waitTask(t, ns, id)
	}
	e.waitStatus(t, ns, dead, stDead)

	_, err := service.Repartition(ctx, cfg, log, grown)
	requireFault(t, fault.Precondition, err, "stop every one first")
	first.stop()
	// A view behind the log, as a replica killed before its flush leaves
	// it: its last states are written before the rows move.
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `UPDATE dispatcher.view_offsets SET events_offset = 0, commands_offset = 0`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE dispatcher.tasks SET state = 'queued', view_offset = -1 WHERE id = $1`, done)
	require.NoError(t, err)

	// Commands the stopped replica never applied, sent under the old count.
	waiting := produceMany(t, e.producer, ns, "work", 20)
	// And a run cut short after its first step: the new count recorded,
	// nothing else done yet.
	_, err = pool.Exec(ctx, `UPDATE dispatcher.view_layout SET partitions = $1`, grown)
	require.NoError(t, err)

	got, err := service.Repartition(ctx, cfg, log, grown)
	require.NoError(t, err)
	require.Equal(t, service.Repartitioned{From: partitions, To: grown, Written: got.Written, Moved: got.Moved}, got)
	require.Positive(t, got.Moved)
	require.Positive(t, got.Written)
	again, err := service.Repartition(ctx, cfg, log, grown)
	require.NoError(t, err)
	require.Zero(t, again.Moved, "a second run finds the work done")
	_, err = service.Repartition(ctx, cfg, log, partitions)
	requireFault(t, fault.Precondition, err, "can only grow")
	requireTopicPartitions(t, broker.Addrs(), grown)

	second := startReplica(t, dbURL, broker.Addrs())
	e.svc, e.client = second.svc, second.client
	// Sent by a producer still on the old count.
	stale := produceTo(t, broker.Addrs(), ns, "work", 20, func(id string) int32 { return kafka.PartitionOf(id, partitions) })

	// Leases survive: the workers' results land.
	for _, a := range leased {
		require.Empty(t, e.report(t, ns, completed(a, `"kept"`, "")), "lease of %s", a.GetTaskId())
	}
	requeued, err := e.client.RequeueDeadLetter(ctx, &flov1.GetTaskRequest{Namespace: ns, TaskId: dead})
	require.NoError(t, err)
	require.Equal(t, stQueued, requeued.GetStatus())
	want := append(append(append(slices.Clone(queued), waiting...), stale...), append(dueSoon, dead)...)
	handed := map[string]int{}
	require.Eventually(t, func() bool {
		for _, a := range e.claim(t, ns, []string{"work"}, 50, 200*time.Millisecond, time.Minute) {
			handed[a.GetTaskId()]++
			require.Empty(t, e.report(t, ns, completed(a, `"ok"`, "")))
		}
		return len(handed) >= len(want)
	}, waitFor, tick, "handed out %d of %d", len(handed), len(want))
	for _, id := range want {
		require.Equal(t, 1, handed[id], "task %s", id)
	}
	require.Len(t, handed, len(want), "only these tasks were queued")
	require.Equal(t, stQueued, e.task(t, ns, dueLater).GetStatus())
	require.Equal(t, stCompleted, e.task(t, ns, done).GetStatus())

	// The view's rows are keyed by the new count, the moved ones' later
	// states included.
	require.Eventually(t, func() bool {
		rows, err := pool.Query(ctx, `SELECT id::text, partition, state FROM dispatcher.tasks WHERE namespace = $1`, ns)
		require.NoError(t, err)
		var (
			id, state string
			part      int32
			n         int
		)
		keyed := true
		for rows.Next() {
			require.NoError(t, rows.Scan(&id, &part, &state))
			keyed = keyed && part == kafka.PartitionOf(id, grown) && (state == "completed" || id == dueLater)
			n++
		}
		require.NoError(t, rows.Err())
		// And the one due later, and the one done before.
		return keyed && n == len(want)+len(leased)+2
	}, waitFor, tick, "the view's rows are in their new partitions, each with its last state")
}

// A replica refuses to run while the view's partition count and the topics'
// differ: a repartition cut short between keying the view and growing the
// topics is finished by running it again.
func TestAReplicaRefusesAViewKeyedByAnotherCount(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	startReplica(t, dbURL, broker.Addrs()).stop()
	pool, err := pgxpool.New(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(t.Context(), `UPDATE dispatcher.view_layout SET partitions = $1`, 2*partitions)
	require.NoError(t, err)

	cfg := replicaConfig(dbURL, broker.Addrs())
	_, err = service.New(t.Context(), cfg, nil)
	requireFault(t, fault.Precondition, err, "dispatcher repartition 8")

	_, err = service.Repartition(t.Context(), cfg, nil, 2*partitions)
	require.NoError(t, err)
	requireTopicPartitions(t, broker.Addrs(), 2*partitions)
	startReplica(t, dbURL, broker.Addrs()).stop()
}

// The outcomes topic came after the other task topics: a replica makes it
// with their partition count, whatever FLO_KAFKA_PARTITIONS says, refuses
// one of another count until a repartition grows it, and a repartition
// makes it when no replica did.
func TestTheOutcomesTopicTakesTheTaskTopicsCount(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	cfg := replicaConfig(dbURL, broker.Addrs())
	startReplica(t, dbURL, broker.Addrs()).stop()
	_, err := service.Repartition(t.Context(), cfg, nil, 2*partitions)
	require.NoError(t, err)
	requireTopicPartitions(t, broker.Addrs(), 2*partitions)

	admin, err := kgo.NewClient(kgo.SeedBrokers(broker.Addrs()...))
	require.NoError(t, err)
	defer admin.Close()
	recreate := func(n int32) {
		t.Helper()
		resp, err := kadm.NewClient(admin).DeleteTopic(t.Context(), kafka.TaskOutcomesTopic)
		require.NoError(t, err)
		require.NoError(t, resp.Err)
		if n > 0 {
			require.NoError(t, kafka.EnsureTopics(t.Context(), admin, n, kafka.TaskOutcomesTopic))
		}
	}

	// An upgraded deployment whose topics were grown past the setting.
	recreate(0)
	startReplica(t, dbURL, broker.Addrs()).stop()
	requireTopicPartitions(t, broker.Addrs(), 2*partitions)

	// Made by another service with the setting's count.
	recreate(partitions)
	_, err = service.New(t.Context(), cfg, nil)
	requireFault(t, fault.Precondition, err, "dispatcher repartition 8")
	_, err = service.Repartition(t.Context(), cfg, nil, 2*partitions)
	require.NoError(t, err)
	requireTopicPartitions(t, broker.Addrs(), 2*partitions)

	recreate(0)
	_, err = service.Repartition(t.Context(), cfg, nil, 2*partitions)
	require.NoError(t, err)
	requireTopicPartitions(t, broker.Addrs(), 2*partitions)
	startReplica(t, dbURL, broker.Addrs()).stop()
}

// requireRekeyed requires that the replica whose Run ends on done stops
// on a view keyed by another count than its own.
func requireRekeyed(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		require.ErrorIs(t, err, view.ErrRekeyed)
	case <-time.After(waitFor):
		t.Fatal("a replica of the old count kept running after the repartition")
	}
}

// replicaConfig is a replica's configuration on ports the system picks.
func replicaConfig(dbURL string, brokers []string) service.Config {
	return service.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Postgres: config.Postgres{URL: dbURL}, Kafka: config.Kafka{Brokers: brokers, Partitions: partitions},
		Auth: harness.InternalAuth(),
	}
}

// requireFault checks err is a fault of kind whose message has msg.
func requireFault(t *testing.T, kind fault.Kind, err error, msg string) {
	t.Helper()
	got, _, ok := fault.KindOf(err)
	require.True(t, ok && got == kind, "%v", err)
	require.ErrorContains(t, err, msg)
}

// requireTopicPartitions checks the three task topics have n partitions.
func requireTopicPartitions(t *testing.T, brokers []string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	require.NoError(t, err)
	defer cl.Close()
	topics := []string{kafka.CommandsTopic, kafka.TaskEventsTopic, kafka.TaskOutcomesTopic}
	details, err := kadm.NewClient(cl).ListTopics(t.Context(), topics...)
	require.NoError(t, err)
	for _, topic := range topics {
		require.Len(t, details[topic].Partitions, n, topic)
	}
}

// produceTo writes n invocations of ns/action, each to the commands
// partition partitionOf gives its id, and returns their ids.
func produceTo(t *testing.T, brokers []string, ns, action string, n int, partitionOf func(id string) int32) []string {
	t.Helper()
	manual, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer manual.Close()
	ids := make([]string, n)
	recs := make([]*kgo.Record, n)
	for i := range ids {
		ids[i] = uuid.NewString()
		value, err := proto.Marshal(&eventsv1.InvokeTask{EventId: uuid.NewString(), TaskId: ids[i], Namespace: ns, Action: action, InvokedAt: timestamppb.Now()})
		require.NoError(t, err)
		recs[i] = &kgo.Record{Topic: kafka.CommandsTopic, Partition: partitionOf(ids[i]), Key: []byte(ids[i]), Value: value}
	}
	require.NoError(t, manual.ProduceSync(t.Context(), recs...).FirstErr())
	return ids
}

// Before any dispatcher created the task topics there is nothing to
// repartition: the count to start with is FLO_KAFKA_PARTITIONS.
func TestRepartitionNeedsTheTaskTopics(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	cfg := service.Config{Postgres: config.Postgres{URL: harness.NewDatabase(t)}, Kafka: config.Kafka{Brokers: broker.Addrs()}}
	_, err := service.Repartition(t.Context(), cfg, nil, 8)
	requireFault(t, fault.Precondition, err, "does not exist")
}

// A replica paused past its session while `dispatcher repartition` ran
// wakes on a view keyed by another count: it writes none of its states
// there and stops, so that its restart runs on the new count, instead of
// retrying.
func TestAReplicaWhoseViewWasRepartitionedStops(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	cfg := replicaConfig(dbURL, broker.Addrs())
	svc, err := service.New(ctx, cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	e := &env{svc: svc, client: dispatcherv1.NewDispatcherClient(harness.DialInternal(t, svc.GRPCAddr())), producer: newProducer(t, broker.Addrs())}
	ns := e.namespace(t)
	e.register(t, ns, "work", nil)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	inView := func(id string) bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM dispatcher.tasks WHERE id = $1`, id).Scan(&n))
		return n == 1
	}
	before := e.invoke(t, ns, "work", `{}`)
	require.Eventually(t, func() bool { return inView(before) }, waitFor, tick)

	// What the repartition leaves while the replica is paused: the view
	// keyed by another count.
	_, err = pool.Exec(ctx, `UPDATE dispatcher.view_layout SET partitions = $1`, 2*partitions)
	require.NoError(t, err)
	after := e.invoke(t, ns, "work", `{}`)
	requireRekeyed(t, done)
	require.False(t, inView(after), "a state of the old count was written")
}

// A replica paused past its session during a repartition is not in the
// group the command checks, and may hold a transaction open. Repartition
// takes every old partition's transactional id before it reads the log:
// that transaction is aborted and can never commit a state the view and
// the new count would miss.
func TestRepartitionFencesTheOwnersOfTheOldCount(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	startReplica(t, dbURL, broker.Addrs()).stop()

	zombie, err := kgo.NewClient(kgo.SeedBrokers(broker.Addrs()...), kgo.TransactionalID("flo-dispatcher-p1"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	t.Cleanup(zombie.Close)
	require.NoError(t, zombie.BeginTransaction())
	require.NoError(t, zombie.ProduceSync(ctx, &kgo.Record{Topic: kafka.TaskEventsTopic, Partition: 1, Value: []byte("late")}).FirstErr())

	cfg := service.Config{Postgres: config.Postgres{URL: dbURL}, Kafka: config.Kafka{Brokers: broker.Addrs(), Partitions: partitions}}
	_, err = service.Repartition(ctx, cfg, slog.New(slog.DiscardHandler), 2*partitions)
	require.NoError(t, err)

	require.Error(t, zombie.EndTransaction(ctx, kgo.TryCommit), "the old owner's transaction committed after the repartition")
	// The abort marker ends the partition: control records count to reach
	// its end.
	reader, err := kgo.NewClient(kgo.SeedBrokers(broker.Addrs()...), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{kafka.TaskEventsTopic: {1: kgo.NewOffset().AtStart()}}))
	require.NoError(t, err)
	t.Cleanup(reader.Close)
	ends, err := kadm.NewClient(reader).ListCommittedOffsets(ctx, kafka.TaskEventsTopic)
	require.NoError(t, err)
	end, _ := ends.Lookup(kafka.TaskEventsTopic, 1)
	for seen := int64(0); seen < end.Offset; {
		fetches := reader.PollFetches(ctx)
		require.NoError(t, fetches.Err())
		fetches.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() {
				require.NotEqual(t, "late", string(r.Value), "a record of the fenced transaction is readable")
			}
			seen = r.Offset + 1
		})
	}
}

// A replica paused before a repartition that wakes after it rejoins the
// group, which gives it partitions of the new count: it stops before it
// takes any of them.
func TestAReplicaStartedBeforeARepartitionStopsOnItsPartitions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	cfg := replicaConfig(dbURL, broker.Addrs())
	// New joins no group: the replica is as good as paused until Run.
	svc, err := service.New(ctx, cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, err = service.Repartition(ctx, cfg, slog.New(slog.DiscardHandler), 2*partitions)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	requireRekeyed(t, done)
	// Every partition is left to a replica of the new count.
	startReplica(t, dbURL, broker.Addrs()).stop()
}
