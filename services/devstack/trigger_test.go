package devstack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/services/devstack"
)

// triggerEnv is a platform with the namespace prod, where the reference's
// order-processor reads its stream prod/orders, created with partitions. It
// returns clients of the namespaces default (the workflow's) and prod.
func triggerEnv(t *testing.T, partitions int) (e *env, c, prod *flo.Client) {
	t.Helper()
	e = newEnvWith(t, func(cfg *devstack.Config) { cfg.Namespaces = append(cfg.Namespaces, "prod") })
	c, prod = e.client(t, "default"), e.client(t, "prod")
	_, err := prod.CreateStream(context.Background(), "orders", flo.StreamOptions{Partitions: partitions})
	require.NoError(t, err)
	return e, c, prod
}

// orderProcessor is the reference's order-processor, as examples/workflows
// has it, with the changes given as old, new pairs.
func orderProcessor(t *testing.T, replace ...string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "examples", "workflows", "order-processor.yaml"))
	require.NoError(t, err)
	return strings.NewReplacer(replace...).Replace(string(src))
}

// triggeredRuns lists every run of workflow, failing on anything but a
// trigger's run.
func triggeredRuns(t *testing.T, c *flo.Client, workflow string) []*flo.Run {
	t.Helper()
	var all []*flo.Run
	token := ""
	for {
		runs, next, err := c.ListRuns(context.Background(), flo.RunFilter{Workflow: workflow, Limit: 1000, PageToken: token})
		require.NoError(t, err)
		all = append(all, runs...)
		if next == "" {
			return all
		}
		token = next
	}
}

// waitRuns waits until workflow has exactly want runs (failing at once on
// more) and returns them.
func waitRuns(t *testing.T, c *flo.Client, workflow string, want int) []*flo.Run {
	t.Helper()
	var runs []*flo.Run
	require.Eventually(t, func() bool {
		runs = triggeredRuns(t, c, workflow)
		require.LessOrEqual(t, len(runs), want, "more runs than records")
		return len(runs) == want
	}, time.Minute, 50*time.Millisecond, "want %d runs", want)
	return runs
}

// requireOneRunPerRecord checks each run started by the trigger from the
// record its key names, with that record's payload {"i": k} as its input,
// and every record of ids started exactly one run.
func requireOneRunPerRecord(t *testing.T, runs []*flo.Run, stream string, ids []string) {
	t.Helper()
	byKey := map[string]*flo.Run{}
	for _, r := range runs {
		require.Equal(t, "trigger", r.StartedBy)
		require.NotContains(t, byKey, r.IdempotencyKey, "two runs for one record")
		byKey[r.IdempotencyKey] = r
	}
	for k, id := range ids {
		r, ok := byKey["trigger:"+stream+"/"+id]
		require.True(t, ok, "no run for record %d (%s)", k, id)
		require.JSONEq(t, fmt.Sprintf(`{"i": %d}`, k), string(r.Input))
	}
	require.Len(t, runs, len(ids))
}

// appendOrders appends n records {"i": from+k} one at a time and returns
// their ids.
func appendOrders(t *testing.T, c *flo.Client, from, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for k := range ids {
		id, err := c.Append(context.Background(), "orders", map[string]int{"i": from + k})
		if !assertNoError(t, err) {
			return ids
		}
		ids[k] = id
	}
	return ids
}

// faultRecords is how many records triggerThroughFault appends, as the
// issue asks: half while the fault strikes, half after.
const faultRecords = 1000

// triggerThroughFault runs the reference's order-processor over
// faultRecords records: half appended one by one while fault strikes (once
// some runs started), half after. It checks each record started exactly one run, with
// its payload as input.
func triggerThroughFault(t *testing.T, fault func(e *env)) (c, prod *flo.Client, runs []*flo.Run) {
	t.Helper()
	e, c, prod := triggerEnv(t, 4)
	_, _, err := c.CreateWorkflow(context.Background(), orderProcessor(t))
	require.NoError(t, err)

	appended := make(chan []string, 1)
	go func() { appended <- appendOrders(t, prod, 0, faultRecords/2) }()
	require.Eventually(t, func() bool { return len(triggeredRuns(t, c, "order-processor")) >= 5 }, time.Minute, 10*time.Millisecond)
	t.Logf("runs when the fault strikes: about %d", len(triggeredRuns(t, c, "order-processor")))
	fault(e)
	ids := append(<-appended, appendOrders(t, prod, faultRecords/2, faultRecords/2)...)
	runs = waitRuns(t, c, "order-processor", faultRecords)
	requireSettled(t, prod, "orders", "wf-orders")
	requireOneRunPerRecord(t, runs, "prod/orders", ids)
	return c, prod, runs
}

func TestBrokerRestartUnderATriggerStartsOneRunPerRecord(t *testing.T) {
	triggerThroughFault(t, func(e *env) { require.NoError(t, e.broker.Restart()) })
}

func TestOrderProcessorStartsOneRunPerRecordThroughAWorkflowServiceRestart(t *testing.T) {
	ctx := context.Background()
	c, prod, runs := triggerThroughFault(t, func(e *env) {
		require.NoError(t, e.stack.StopWorkflow())
		require.NoError(t, e.stack.StartWorkflow(ctx))
	})

	hist, err := c.GetRunHistory(ctx, runs[0].ID)
	require.NoError(t, err)
	require.Equal(t, "trigger_fired", hist[0].Type)
	require.Equal(t, "trigger:prod/orders/"+hist[0].Detail, runs[0].IdempotencyKey)

	// Every record handed out again, as after a crash before the acks:
	// the runs are found by their keys, none starts twice.
	require.NoError(t, prod.DeleteGroup(ctx, "orders", "wf-orders"))
	require.Eventually(t, func() bool {
		groups, err := prod.ListGroups(ctx, "orders")
		require.NoError(t, err)
		return len(groups) == 1 && groups[0].Lag == 0 && groups[0].Pending == 0
	}, time.Minute, 50*time.Millisecond, "the trigger never re-read the stream")
	require.Len(t, triggeredRuns(t, c, "order-processor"), faultRecords)
}

func TestTriggerBatchesStartOneRunPerTenRecords(t *testing.T) {
	_, c, prod := triggerEnv(t, 4)
	ctx := context.Background()
	// Appended before the workflow exists: the group starts at the
	// stream's first record.
	ids := appendN(t, prod, "orders", 100, 25)
	_, _, err := c.CreateWorkflow(ctx, orderProcessor(t, "batch_size: 1 ", "batch_size: 10 "))
	require.NoError(t, err)

	runs := waitRuns(t, c, "order-processor", 10)
	requireSettled(t, prod, "orders", "wf-orders")
	seen := map[int]int{}
	for _, r := range runs {
		var batch []struct{ I int }
		require.NoError(t, json.Unmarshal(r.Input, &batch), "input %s", r.Input)
		require.Len(t, batch, 10)
		require.True(t, strings.HasPrefix(r.IdempotencyKey, "trigger:prod/orders/"))
		require.Contains(t, ids, strings.TrimPrefix(r.IdempotencyKey, "trigger:prod/orders/"))
		for _, b := range batch {
			seen[b.I]++
		}
	}
	for k := range 100 {
		require.Equal(t, 1, seen[k], "record %d in %d runs", k, seen[k])
	}
}

func TestDisabledTriggerStopsConsumingAndEnableResumesWithoutLoss(t *testing.T) {
	_, c, prod := triggerEnv(t, 2)
	ctx := context.Background()
	_, _, err := c.CreateWorkflow(ctx, orderProcessor(t))
	require.NoError(t, err)
	ids := appendN(t, prod, "orders", 20, 10)
	waitRuns(t, c, "order-processor", 20)

	_, err = c.DisableWorkflow(ctx, "order-processor")
	require.NoError(t, err)
	ids = append(ids, appendN(t, prod, "orders", 30, 10)...)
	// The records wait in the group while the workflow is disabled.
	require.Never(t, func() bool { return len(triggeredRuns(t, c, "order-processor")) > 20 }, 3*time.Second, 100*time.Millisecond)
	groups, err := prod.ListGroups(ctx, "orders")
	require.NoError(t, err)
	require.Len(t, groups, 1)
	require.EqualValues(t, 30, groups[0].Lag+groups[0].Pending)

	_, err = c.EnableWorkflow(ctx, "order-processor")
	require.NoError(t, err)
	runs := waitRuns(t, c, "order-processor", 50)
	requireSettled(t, prod, "orders", "wf-orders")
	byKey := map[string]bool{}
	for _, r := range runs {
		byKey[r.IdempotencyKey] = true
	}
	for _, id := range ids {
		require.True(t, byKey["trigger:prod/orders/"+id], "no run for record %s", id)
	}
	require.Len(t, byKey, 50)
}

func TestNewTriggerVersionSwitchesTheReaderAndRecordsWithRunsStartNoOther(t *testing.T) {
	_, c, prod := triggerEnv(t, 2)
	ctx := context.Background()
	_, _, err := c.CreateWorkflow(ctx, orderProcessor(t))
	require.NoError(t, err)
	appendN(t, prod, "orders", 10, 10)
	waitRuns(t, c, "order-processor", 10)

	// Version 2 reads with a new group from the stream's first record, in
	// batches: the ten records have runs, so they start none.
	_, _, err = c.CreateWorkflow(ctx, orderProcessor(t, `version: "1.0.0"`, `version: "2.0.0"`,
		"consumer_group: wf-orders ", "consumer_group: wf-orders-v2 ", "batch_size: 1 ", "batch_size: 5 "))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		groups, err := prod.ListGroups(ctx, "orders")
		require.NoError(t, err)
		return slices.ContainsFunc(groups, func(g *flo.ConsumerGroup) bool { return g.Name == "wf-orders-v2" })
	}, time.Minute, 50*time.Millisecond)
	requireSettled(t, prod, "orders", "wf-orders-v2")
	require.Len(t, triggeredRuns(t, c, "order-processor"), 10)

	appendN(t, prod, "orders", 10, 10)
	runs := waitRuns(t, c, "order-processor", 12)
	requireSettled(t, prod, "orders", "wf-orders-v2")
	var batched int
	for _, r := range runs {
		if r.Version == "2.0.0" {
			var batch []json.RawMessage
			require.NoError(t, json.Unmarshal(r.Input, &batch))
			require.Len(t, batch, 5)
			batched++
		}
	}
	require.Equal(t, 2, batched)
}

func TestTriggerGroupsTakeTheTriggersMode(t *testing.T) {
	_, c, prod := triggerEnv(t, 4)
	ctx := context.Background()
	for _, mode := range []string{flo.GroupKeyShared, flo.GroupExclusive} {
		_, _, err := c.CreateWorkflow(ctx, orderProcessor(t, "name: order-processor", "name: orders-"+mode,
			"consumer_group: wf-orders ", "consumer_group: wf-"+mode+" ", "mode: shared ", "mode: "+mode+" "))
		require.NoError(t, err)
	}
	ids := make([]string, 40)
	for k := range ids {
		id, err := prod.Append(ctx, "orders", map[string]int{"i": k}, flo.WithKey(fmt.Sprintf("customer-%d", k%4)))
		require.NoError(t, err)
		ids[k] = id
	}
	for _, mode := range []string{flo.GroupKeyShared, flo.GroupExclusive} {
		runs := waitRuns(t, c, "orders-"+mode, 40)
		requireSettled(t, prod, "orders", "wf-"+mode)
		requireOneRunPerRecord(t, runs, "prod/orders", ids)
	}
	groups, err := prod.ListGroups(ctx, "orders")
	require.NoError(t, err)
	modes := map[string]string{}
	for _, g := range groups {
		modes[g.Name] = g.Mode
	}
	require.Equal(t, map[string]string{"wf-" + flo.GroupKeyShared: flo.GroupKeyShared, "wf-" + flo.GroupExclusive: flo.GroupExclusive}, modes)
}

// TestTriggerThroughAWorkflowCrashStartsOneRunPerRecord kills the real
// workflow process with SIGKILL while its trigger starts runs: the records it
// held come back after the trigger's message timeout (2s here), and every
// record still starts exactly one run.
func TestTriggerThroughAWorkflowCrashStartsOneRunPerRecord(t *testing.T) {
	pl := startProcessPlatform(t)
	ctx := context.Background()
	c := pl.client(t)
	_, err := c.CreateStream(ctx, "orders", flo.StreamOptions{Partitions: 4})
	require.NoError(t, err)
	// The stream in the workflow's own namespace.
	_, _, err = c.CreateWorkflow(ctx, orderProcessor(t, "  namespace: prod # source namespace (optional)\n", ""))
	require.NoError(t, err)

	appended := make(chan []string, 1)
	go func() { appended <- appendOrders(t, c, 0, 300) }()
	require.Eventually(t, func() bool { return len(triggeredRuns(t, c, "order-processor")) >= 5 }, time.Minute, 10*time.Millisecond)
	pl.procs["workflow"].crash(t)
	ids := <-appended
	runs := waitRuns(t, c, "order-processor", 300)
	requireSettled(t, c, "orders", "wf-orders")
	requireOneRunPerRecord(t, runs, "default/orders", ids)
	duplicates, _ := scrapeMetrics(t, pl.procs["workflow"].httpAddr).value("flo_workflow_trigger_records_total", "result", "duplicate")
	t.Logf("records handed out again that found their run, since the restart: %v", duplicates)
}
