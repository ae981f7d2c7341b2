package devstack_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
)

// TestCrashMidRunsRepeatsNoTransition kills the real workflow and dispatcher
// processes with SIGKILL while hundreds of runs are under way, with retry
// timers pending and task events in flight, and starts them again: every run
// completes and its history shows each transition once.
func TestCrashMidRunsRepeatsNoTransition(t *testing.T) {
	for _, name := range []string{"workflow", "dispatcher"} {
		t.Run(name, func(t *testing.T) {
			pl := startProcessPlatform(t)
			runsThroughFault(t, pl.gatewayGRPC, 300, func() { pl.procs[name].crash(t) })
			// Task events seen again (past the killed consumer's committed
			// offsets, or published again from the killed dispatcher's
			// outbox) changed nothing, as the histories show; how many
			// there were depends on where the kill struck.
			stale, _ := scrapeMetrics(t, pl.procs["workflow"].httpAddr).value("flo_workflow_task_events_stale_total")
			t.Logf("task events for waits already left, since the workflow service's last start: %v", stale)
		})
	}
}

// TestStreamsCrashMidConsumptionLosesAndRepeatsNothing kills the real streams
// process with SIGKILL while three stream workers of one group consume, and
// starts it again. Every record reaches a handler; a handler may see a record
// again if its ack died with the process, but the group settles every record
// exactly once: the restarted process acks exactly the records that were not
// settled when it was killed, and then none is pending.
func TestStreamsCrashMidConsumptionLosesAndRepeatsNothing(t *testing.T) {
	pl := startProcessPlatform(t)
	ctx := context.Background()
	client := pl.client(t)
	const stream, group = "feed", "g"
	_, err := client.CreateStream(ctx, stream, flo.StreamOptions{Partitions: 4})
	require.NoError(t, err)
	_, err = client.CreateGroup(ctx, stream, group, flo.GroupOptions{})
	require.NoError(t, err)
	require.Zero(t, settledRecords(t, pl.env.db, stream, group), "a new group of an empty stream has settled nothing")

	got := &handlerRuns{runs: map[string]int{}}
	for w := range 3 {
		// A short message timeout, so records whose acks died with the
		// process come back soon.
		sw, err := pl.client(t).NewStreamWorker(flo.StreamWorkerOptions{
			Stream: stream, Group: group, Concurrency: 16, BatchSize: 100, MessageTimeout: 2 * time.Second,
		}, func(sctx *flo.StreamContext) error {
			got.add(sctx.StreamID())
			return nil
		})
		require.NoError(t, err)
		runUntilCleanup(t, fmt.Sprintf("stream worker %d", w), sw.Start)
	}
	const n = 5000
	ids := appendN(t, client, stream, n, 250)
	require.Eventually(t, func() bool { return got.distinct() >= n/3 }, time.Minute, 5*time.Millisecond)

	streams := pl.procs["streams"]
	require.Positive(t, sessions(t, pl.env.db, "streams"), "the streams service's sessions are not named")
	streams.sigkill(t)
	// The dead process's last commit may still be under way in its
	// sessions; once they are gone, nothing changes the group until the
	// service is back.
	require.Eventually(t, func() bool { return sessions(t, pl.env.db, "streams") == 0 }, 30*time.Second, 10*time.Millisecond,
		"sessions of the killed streams service stayed")
	settled := settledRecords(t, pl.env.db, stream, group)
	require.Less(t, settled, int64(n), "every record was settled before the kill")
	t.Logf("killed with %d of %d records settled and %d handled", settled, n, got.distinct())
	streams.start(t)
	streams.waitReady(t)

	require.Eventually(t, func() bool { return got.distinct() == n }, time.Minute, 20*time.Millisecond,
		"handled %d of %d records", got.distinct(), n)
	requireSettled(t, client, stream, group)
	got.requireEachRan(t, ids)

	// The ack counter counts records an ack settled, each once; the new
	// process must have settled the rest and nothing settled before.
	want := float64(int64(n) - settled)
	var acked float64
	require.Eventually(t, func() bool {
		acked, _ = scrapeMetrics(t, streams.httpAddr).value("flo_streams_records_acked_total")
		return acked >= want
	}, 30*time.Second, 50*time.Millisecond, "the restarted streams service never acked %v records", want)
	require.Equal(t, want, acked, "records acked by the restarted streams service")
	delivered, _ := scrapeMetrics(t, streams.httpAddr).value("flo_streams_records_delivered_total")
	t.Logf("the restarted streams service delivered %v records and acked %v", delivered, acked)
	require.Equal(t, int64(n), settledRecords(t, pl.env.db, stream, group), "records the group settled")
}

// settledRecords reads, from the streams service's tables, how many records
// of stream the group has settled: those below its cursors that no pending
// range still holds unsettled.
func settledRecords(t *testing.T, db *pgxpool.Pool, stream, group string) int64 {
	t.Helper()
	var settled int64
	err := db.QueryRow(context.Background(), `
		SELECT (SELECT coalesce(sum(c.next_offset), 0) FROM streams.cursors c WHERE c.group_id = g.id)::bigint
		     - (SELECT coalesce(sum(p.unsettled), 0) FROM streams.pending p WHERE p.group_id = g.id)::bigint
		FROM streams.groups g JOIN streams.streams s ON s.id = g.stream_id
		WHERE s.namespace = 'default' AND s.name = $1 AND g.name = $2`, stream, group).Scan(&settled)
	require.NoError(t, err)
	return settled
}

// sessions counts the database sessions of the service name (its
// application_name).
func sessions(t *testing.T, db *pgxpool.Pool, name string) int {
	t.Helper()
	var n int
	err := db.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, name).Scan(&n)
	require.NoError(t, err)
	return n
}

// distinct is how many ids ran at least once.
func (h *handlerRuns) distinct() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.runs)
}
