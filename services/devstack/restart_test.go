package devstack_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	gateway "github.com/razorbill/flo/services/gateway/service"
)

// load invokes n tasks of action with idempotency keys, retrying each until
// the gateway accepts it, as a careful client does across an outage. fault
// runs once, after a third of the tasks are in.
func load(t *testing.T, client *flo.Client, action string, n int, fault func()) []string {
	t.Helper()
	l := startLoad(t, n, 0, invokeKeyed(client, action, "load"))
	l.reach(t, n/3)
	fault()
	return l.wait(t)
}

// requireEachCompletedOnce waits until every id is completed in Postgres and
// then checks the task events: exactly one distinct completion per task.
func requireEachCompletedOnce(t *testing.T, e *env, brokers []string, ids []string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var done int
		err := e.db.QueryRow(context.Background(),
			`SELECT count(*) FROM dispatcher.tasks WHERE id = ANY($1) AND state = 'completed'`, ids).Scan(&done)
		require.NoError(t, err)
		return done == len(ids)
	}, 90*time.Second, 100*time.Millisecond)

	// Read committed, as every consumer of task events does: records of an
	// aborted transaction were never part of the log.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(kafka.TaskEventsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	require.NoError(t, err)
	defer cl.Close()
	completions := map[string]map[string]bool{} // task id -> completion event ids
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for len(completions) < len(ids) {
		fetches := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "saw completions for %d of %d tasks", len(completions), len(ids))
		fetches.EachRecord(func(r *kgo.Record) {
			var ev eventsv1.TaskEvent
			require.NoError(t, proto.Unmarshal(r.Value, &ev))
			if ev.GetType() != eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED || !want[ev.GetTaskId()] {
				return
			}
			if completions[ev.GetTaskId()] == nil {
				completions[ev.GetTaskId()] = map[string]bool{}
			}
			completions[ev.GetTaskId()][ev.GetEventId()] = true
		})
	}
	for id, evs := range completions {
		require.Len(t, evs, 1, "task %s completed more than once", id)
	}
}

func TestBrokerRestartUnderLoadLosesNothing(t *testing.T) {
	e := newEnv(t)
	client := e.client(t, "default")
	ctx := context.Background()
	_, err := client.RegisterAction(ctx, "work", flo.ActionOptions{Timeout: 3 * time.Second, MaxAttempts: 20})
	require.NoError(t, err)
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 32}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("work", func(actx *flo.ActionContext) ([]byte, error) { return actx.Bytes("ok") })
	})

	ids := load(t, client, "work", 1500, func() {
		require.NoError(t, e.broker.Restart())
	})
	requireEachCompletedOnce(t, e, e.broker.Addrs(), ids)
}

func TestDispatcherKilledUnderLoadLosesNothing(t *testing.T) {
	broker := harness.NewBroker(t)
	dbURL := harness.NewDatabase(t)
	// The real binary, so the test can kill it with SIGKILL like an
	// orchestrator would.
	proc := newProc(t, "dispatcher", []string{
		"FLO_DATABASE_URL=" + dbURL,
		"FLO_KAFKA_BROKERS=" + strings.Join(broker.Addrs(), ","),
		"FLO_KAFKA_PARTITIONS=4",
		"FLO_BOOTSTRAP_NAMESPACES=default",
		"FLO_LOG_LEVEL=warn",
	})
	proc.start(t)
	proc.waitReady(t)

	ctx, cancel := context.WithCancel(context.Background())
	gwCfg := gateway.Config{
		GRPCAddr:        "127.0.0.1:0",
		HTTPAddr:        "127.0.0.1:0",
		DispatcherAddr:  proc.grpcAddr,
		MaxPayloadBytes: 64 << 10,
		Auth:            harness.InternalAuth(),
		Kafka:           config.Kafka{Brokers: broker.Addrs(), Partitions: 4},
	}
	gwCfg.APIKeys.AdminToken = testAdminToken
	gw, err := gateway.New(ctx, gwCfg, testLogger(t))
	require.NoError(t, err)
	gwDone := make(chan error, 1)
	go func() { gwDone <- gw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-gwDone
	})

	e := &env{db: openPool(t, dbURL)}
	client := connect(t, gw.GRPCAddr())
	require.Eventually(t, func() bool {
		_, err := client.RegisterAction(ctx, "work", flo.ActionOptions{Timeout: 3 * time.Second, MaxAttempts: 20})
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)

	actionWorker(t, gw.GRPCAddr(), flo.ActionWorkerOptions{Concurrency: 32}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("work", func(actx *flo.ActionContext) ([]byte, error) { return actx.Bytes("ok") })
	})

	ids := load(t, client, "work", 1500, func() { proc.crash(t) })
	requireEachCompletedOnce(t, e, broker.Addrs(), ids)
	// The restarted process, on its predecessor's address, removed the
	// dead member from the group instead of waiting out its session.
	out, err := os.ReadFile(proc.logs.Name())
	require.NoError(t, err)
	require.Contains(t, string(out), "this replica listens at its address now")
}
