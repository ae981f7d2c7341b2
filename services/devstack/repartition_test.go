package devstack_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
)

// TestRepartitionUnderLoad raises the task topics' partition count with
// the real binaries while invocations keep coming: the dispatcher stops
// (SIGTERM), `dispatcher repartition` runs with its environment, and the
// dispatcher starts again on twice the partitions. The gateway's commands
// meanwhile wait in the log under the old count, and after the change some
// still come that way until its client sees the new count. Every task
// completes once, delayed ones when due, and the view is keyed by the new
// count.
func TestRepartitionUnderLoad(t *testing.T) {
	pl := startProcessPlatform(t)
	client, runs := pl.mixedWorkers(t)
	// Workflow runs too, whose steps' events the workflow service reads
	// through the change.
	ctx := context.Background()
	_, err := client.RegisterAction(ctx, "step", flo.ActionOptions{Timeout: 3 * time.Second, MaxAttempts: 20})
	require.NoError(t, err)
	actionWorker(t, pl.gatewayGRPC, flo.ActionWorkerOptions{WorkerID: "stepper", Concurrency: 16}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("step", func(actx *flo.ActionContext) ([]byte, error) { return actx.Bytes("ok") })
	})
	_, _, err = client.CreateWorkflow(ctx, oneStepWorkflowYAML)
	require.NoError(t, err)
	var runIDs []string
	startRuns := func(k int) {
		for range k {
			run, err := client.StartWorkflow(ctx, "one-step", map[string]int{"i": len(runIDs)}, flo.StartWorkflowOptions{})
			require.NoError(t, err)
			runIDs = append(runIDs, run.RunID)
		}
	}
	startRuns(20)

	const n = 600
	load := startLoad(t, n, 5*time.Millisecond, invokeMixed(client, "grow"))
	load.reach(t, n/3)
	d := pl.procs["dispatcher"]
	d.sigterm(t)
	grown := 2 * platformPartitions
	repartition(t, d, grown)
	d.start(t)
	d.waitReady(t)
	startRuns(40)

	ids := load.wait(t)
	requireKeyedBy(t, pl, ids, runs, grown)
	for _, id := range runIDs {
		run, err := client.AwaitRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, flo.RunCompleted, run.Status, "run %s: %s", id, run.Error)
	}
}

// repartition runs `dispatcher repartition n` with d's environment, and
// gives d the new count for its next start.
func repartition(t *testing.T, d *proc, n int) {
	t.Helper()
	cmd := exec.Command(d.bin, "repartition", strconv.Itoa(n))
	cmd.Env = append(append(os.Environ(), "FLO_INTERNAL_TOKEN="+harness.InternalAuth().InternalToken), d.env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "dispatcher repartition: %s", out)
	require.Contains(t, string(out), "task topics repartitioned")
	d.env = append(d.env, "FLO_KAFKA_PARTITIONS="+strconv.Itoa(n))
}

// requireKeyedBy requires that every task of ids completed once, delayed
// ones when due, that the view caught up with the log, and that both task
// topics and the view's rows are keyed by grown partitions.
func requireKeyedBy(t *testing.T, pl *processPlatform, ids []string, runs *attemptRuns, grown int) {
	t.Helper()
	log, _ := requireCompletedOnce(t, pl.env.db, pl.brokers, ids, runs)
	requireStartedWhenDue(t, pl.env.db, ids)
	requireViewCaughtUp(t, pl.env.db, log)

	cl, err := kgo.NewClient(kgo.SeedBrokers(pl.brokers...))
	require.NoError(t, err)
	defer cl.Close()
	names := []string{kafka.CommandsTopic, kafka.TaskEventsTopic, kafka.TaskOutcomesTopic}
	topics, err := kadm.NewClient(cl).ListTopics(context.Background(), names...)
	require.NoError(t, err)
	for _, topic := range names {
		require.Len(t, topics[topic].Partitions, grown, topic)
	}
	parts := queryMap[string, int32](t, pl.env.db, `SELECT id::text, partition FROM dispatcher.tasks WHERE id = ANY($1)`, ids)
	moved := 0
	for _, id := range ids {
		require.Equal(t, kafka.PartitionOf(id, int32(grown)), parts[id], "task %s", id)
		if parts[id] != kafka.PartitionOf(id, platformPartitions) {
			moved++
		}
	}
	t.Logf("%d of %d tasks are in another partition of %d than of %d", moved, len(ids), grown, platformPartitions)
}

// A dispatcher frozen past its session (SIGSTOP) is out of the group, so
// `dispatcher repartition` runs with it still alive and holding
// partitions, leases and a transaction in flight. On waking it commits
// nothing more (the command took its transactional ids), writes nothing
// keyed by the old count into the view, and exits with an error; started
// again, as an orchestrator does, it runs on the new count, and every task
// completes once.
func TestADispatcherFrozenThroughARepartitionStops(t *testing.T) {
	pl := startProcessPlatform(t)
	client, runs := pl.mixedWorkers(t)
	const n = 400
	load := startLoad(t, n, 5*time.Millisecond, invokeMixed(client, "frozen"))
	load.reach(t, n/3)

	zombie := pl.procs["dispatcher"]
	thaw := freeze(t, zombie)
	cl, err := kgo.NewClient(kgo.SeedBrokers(pl.brokers...))
	require.NoError(t, err)
	defer cl.Close()
	require.Eventually(t, func() bool {
		groups, err := kadm.NewClient(cl).DescribeGroups(context.Background(), "flo-dispatcher")
		require.NoError(t, err)
		return len(groups["flo-dispatcher"].Members) == 0
	}, time.Minute, 50*time.Millisecond, "the group never dropped the frozen dispatcher")
	grown := 2 * platformPartitions
	repartition(t, zombie, grown)

	thaw()
	select {
	case <-zombie.exited:
	case <-time.After(time.Minute):
		t.Fatal("the dispatcher kept running on the old partition count")
	}
	require.NotZero(t, zombie.cmd.ProcessState.ExitCode(), "its exit status")
	out, err := os.ReadFile(zombie.logs.Name())
	require.NoError(t, err)
	require.Contains(t, string(out), "the task view was repartitioned")
	zombie.start(t)
	zombie.waitReady(t)

	requireKeyedBy(t, pl, load.wait(t), runs, grown)
}
