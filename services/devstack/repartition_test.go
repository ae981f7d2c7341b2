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
	client := pl.client(t)
	registerMixed(t, client)
	runs := newAttemptRuns()
	runMixedWorkers(t, pl.gatewayGRPC, runs)

	const n = 600
	load := startLoad(t, n, 5*time.Millisecond, invokeMixed(client, "grow"))
	load.reach(t, n/3)
	d := pl.procs["dispatcher"]
	d.sigterm(t)
	grown := 2 * platformPartitions
	cmd := exec.Command(d.bin, "repartition", strconv.Itoa(grown))
	cmd.Env = append(append(os.Environ(), "FLO_INTERNAL_TOKEN="+harness.InternalAuth().InternalToken), d.env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "dispatcher repartition: %s", out)
	require.Contains(t, string(out), "task topics repartitioned")
	d.env = append(d.env, "FLO_KAFKA_PARTITIONS="+strconv.Itoa(grown))
	d.start(t)
	d.waitReady(t)

	ids := load.wait(t)
	log, _ := requireCompletedOnce(t, pl.env.db, pl.brokers, ids, runs)
	requireStartedWhenDue(t, pl.env.db, ids)
	requireViewCaughtUp(t, pl.env.db, log)

	cl, err := kgo.NewClient(kgo.SeedBrokers(pl.brokers...))
	require.NoError(t, err)
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(context.Background(), kafka.CommandsTopic, kafka.TaskEventsTopic)
	require.NoError(t, err)
	for _, topic := range []string{kafka.CommandsTopic, kafka.TaskEventsTopic} {
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
