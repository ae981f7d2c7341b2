package devstack_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// The failure tests of log-first dispatch (issue 15): a partition owner
// killed, a zombie owner resumed, the broker and Postgres restarted, and
// replicas added and removed, each under a mixed load of leased, delayed
// and retried tasks. Each checks the same promises: every task reaches
// exactly one final state, on the log and in the view, and no attempt runs
// once a later one, or the task's end, was recorded.

const (
	// platformPartitions is the process platform's FLO_KAFKA_PARTITIONS.
	platformPartitions = 4
	// mixedAction is the action of the mixed load.
	mixedAction = "work"
	// mixedTimeout is the action's timeout, the lease a worker gets: most
	// leases outlive the move of their partition, and tasks handed out by a
	// replica that died run again within the test.
	mixedTimeout = 12 * time.Second
	// mixedDelay is how long every fifth task of the load waits to run.
	mixedDelay = 2 * time.Second
	// claimBlockMS is how long the workers' claims wait for tasks. A
	// claim waits at the replicas its gateway knew when it was sent, so a
	// replica added or a partition moved meanwhile is seen by the next
	// claim; short waits keep the tests' tasks from waiting 30 s for it.
	claimBlockMS = 1000
)

// addDispatcher starts one more dispatcher process beside the platform's,
// on ports the system picks (it advertises the address it listens on), and
// waits until it is ready. The gateway keeps dialing the first; it claims
// from every replica the owners table lists.
func (pl *processPlatform) addDispatcher(t *testing.T, name string, extra ...string) *proc {
	t.Helper()
	vars := append([]string{"FLO_DATABASE_URL=" + withApplicationName(t, pl.dbURL, name)}, pl.common...)
	// A variable set again in extra wins (os/exec keeps the last).
	vars = append(vars, extra...)
	p := newReplicaProc(t, "dispatcher", name, vars)
	p.start(t)
	p.waitReady(t)
	pl.procs[name] = p
	return p
}

// partitionOwners reads the address of each task partition's owner, as
// gateways and replicas route by it.
func partitionOwners(t *testing.T, db *pgxpool.Pool) map[int32]string {
	t.Helper()
	return queryMap[int32, string](t, db, `SELECT partition, address FROM dispatcher.partition_owners`)
}

// queryMap runs a query of two columns and maps each row's first to its
// second.
func queryMap[K comparable, V any](t *testing.T, db *pgxpool.Pool, sql string, args ...any) map[K]V {
	t.Helper()
	rows, err := db.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	out := map[K]V{}
	var (
		k K
		v V
	)
	_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error {
		out[k] = v
		return nil
	})
	require.NoError(t, err)
	return out
}

// owned lists the partitions owners gives addr.
func owned(owners map[int32]string, addr string) []int32 {
	var out []int32
	for p, a := range owners {
		if a == addr {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// waitShared waits until every task partition has an owner and each of
// addrs owns some.
func waitShared(t *testing.T, db *pgxpool.Pool, addrs ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		owners := partitionOwners(t, db)
		if len(owners) != platformPartitions {
			return false
		}
		for _, a := range addrs {
			if len(owned(owners, a)) == 0 {
				return false
			}
		}
		return true
	}, time.Minute, 20*time.Millisecond, "the replicas %v never shared the partitions", addrs)
}

// attemptRuns records which attempts of each task reached a handler.
type attemptRuns struct {
	mu    sync.Mutex
	runs  map[string][]int
	ended atomic.Int64
}

func newAttemptRuns() *attemptRuns { return &attemptRuns{runs: map[string][]int{}} }

func (r *attemptRuns) add(id string, attempt int) {
	r.mu.Lock()
	r.runs[id] = append(r.runs[id], attempt)
	r.mu.Unlock()
}

// of returns the attempts of id that ran, in order.
func (r *attemptRuns) of(id string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.runs[id])
}

// waitEnded waits until n handler runs ended.
func (r *attemptRuns) waitEnded(t *testing.T, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return r.ended.Load() >= n }, time.Minute, 5*time.Millisecond,
		"only %d handler runs ended", r.ended.Load())
}

// mixedWorkers registers the mixed load's action, starts its workers and
// returns a client of the platform and the workers' handler runs.
func (pl *processPlatform) mixedWorkers(t *testing.T) (*flo.Client, *attemptRuns) {
	t.Helper()
	client := pl.client(t)
	registerMixed(t, client)
	runs := newAttemptRuns()
	runMixedWorkers(t, pl.gatewayGRPC, runs)
	return client, runs
}

// registerMixed registers the mixed load's action: retries back off
// 500 ms, so some are always pending.
func registerMixed(t *testing.T, c *flo.Client) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := c.RegisterAction(context.Background(), mixedAction, flo.ActionOptions{
			Timeout: mixedTimeout, MaxAttempts: 20,
			Backoff: &flo.Backoff{Kind: flo.BackoffConstant, Initial: 500 * time.Millisecond},
		})
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)
}

// failsFirst says whether the mixed load's task i fails its first attempt.
func failsFirst(i int) bool { return i%4 == 0 }

// delayed says whether the mixed load's task i is invoked with mixedDelay.
func delayed(i int) bool { return i%5 == 1 }

// runMixedWorkers runs two SDK workers of 16 slots on the gateway at addr,
// recording every run. A run takes 20-60 ms of work, so leases are held
// all along; the first attempt of a task that failsFirst fails.
func runMixedWorkers(t *testing.T, addr string, runs *attemptRuns) {
	t.Helper()
	for w := range 2 {
		opts := flo.ActionWorkerOptions{WorkerID: fmt.Sprintf("mixed-%d", w), Concurrency: 16, BlockMS: claimBlockMS}
		actionWorker(t, addr, opts, func(w *flo.ActionWorker) {
			w.MustRegisterAction(mixedAction, func(actx *flo.ActionContext) ([]byte, error) {
				runs.add(actx.TaskID(), actx.Attempt())
				defer runs.ended.Add(1)
				var in struct {
					I int `json:"i"`
				}
				if err := actx.Into(&in); err != nil {
					return nil, err
				}
				// The work a task takes.
				time.Sleep(time.Duration(20+in.I%5*10) * time.Millisecond)
				if failsFirst(in.I) && actx.Attempt() == 1 {
					return nil, errors.New("the first attempt of every fourth task fails")
				}
				return actx.Bytes(in.I)
			})
		})
	}
}

// invokeMixed invokes task i of the mixed load with payload {"i": i} and
// the idempotency key prefix-i; delayed tasks wait mixedDelay and every
// third task has a higher priority.
func invokeMixed(c *flo.Client, prefix string) func(ctx context.Context, i int) (string, error) {
	return func(ctx context.Context, i int) (string, error) {
		opts := []flo.InvokeOption{flo.WithIdempotencyKey(fmt.Sprintf("%s-%d", prefix, i))}
		if delayed(i) {
			opts = append(opts, flo.WithDelay(mixedDelay))
		}
		if i%3 == 0 {
			opts = append(opts, flo.WithPriority(1))
		}
		return c.Invoke(ctx, mixedAction, map[string]int{"i": i}, opts...)
	}
}

// taskRecord is one task event as read_committed consumers see it.
type taskRecord struct {
	typ       eventsv1.TaskEventType
	attempt   int32
	partition int32
	offset    int64
	epoch     int16
}

// taskLog is the task events topic as read_committed consumers (every
// service's) see it.
type taskLog struct {
	byTask      map[string][]taskRecord
	byPartition map[int32][]taskRecord
}

// readTaskLog reads the task events topic, as read_committed consumers see
// it, at least to the end each partition has now. Records of aborted
// transactions were never part of the log. A task's records are in
// partition, then offset order: a repartition that doubles the count moves
// a task from partition p only to p or p+n, after its records in p.
func readTaskLog(t *testing.T, brokers []string) taskLog {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(kafka.TaskEventsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers take offsets too; without them a partition
		// whose last record is a marker never seems read to its end.
		kgo.KeepControlRecords())
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, kafka.TaskEventsTopic)
	require.NoError(t, err)
	require.NoError(t, ends.Error())
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			end[o.Partition] = o.Offset
		}
	})
	log := taskLog{byTask: map[string][]taskRecord{}, byPartition: map[int32][]taskRecord{}}
	next := map[int32]int64{}
	for left := len(end); left > 0; {
		fetches := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "the task log was not read to its end: %v of %v", next, end)
		fetches.EachError(func(_ string, p int32, err error) { require.NoError(t, err, "fetch partition %d", p) })
		fetches.EachRecord(func(r *kgo.Record) {
			if next[r.Partition] < end[r.Partition] && r.Offset+1 >= end[r.Partition] {
				left--
			}
			next[r.Partition] = r.Offset + 1
			if r.Attrs.IsControl() {
				return
			}
			var ev eventsv1.TaskEvent
			require.NoError(t, proto.Unmarshal(r.Value, &ev))
			rec := taskRecord{typ: ev.GetType(), attempt: ev.GetAttempt(), partition: r.Partition, offset: r.Offset, epoch: r.ProducerEpoch}
			log.byTask[ev.GetTaskId()] = append(log.byTask[ev.GetTaskId()], rec)
			log.byPartition[r.Partition] = append(log.byPartition[r.Partition], rec)
		})
	}
	for _, recs := range log.byTask {
		slices.SortStableFunc(recs, func(a, b taskRecord) int {
			return cmp.Or(cmp.Compare(a.partition, b.partition), cmp.Compare(a.offset, b.offset))
		})
	}
	return log
}

// final reports whether a task event ends its task.
func final(typ eventsv1.TaskEventType) bool {
	switch typ {
	case eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED, eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED:
		return true
	}
	return false
}

// waitViewState waits until the view holds every id in state; when it never
// does, it explains what is missing from the view and, with brokers, from
// the log.
func waitViewState(t *testing.T, db *pgxpool.Pool, brokers []string, ids []string, state string) {
	t.Helper()
	ok := assert.Eventually(t, func() bool {
		var n int
		// Postgres may be restarting under the test: a failed read is
		// read again.
		err := db.QueryRow(context.Background(),
			`SELECT count(*) FROM dispatcher.tasks WHERE id = ANY($1) AND state = $2`, ids, state).Scan(&n)
		return err == nil && n == len(ids)
	}, 90*time.Second, 50*time.Millisecond)
	if !ok {
		explainMissing(t, db, brokers, ids, state)
	}
	require.True(t, ok, "the view never held all %d tasks %s: %v", len(ids), state, viewStates(t, db, ids))
}

// explainMissing logs, for the ids the view does not hold in state, their
// partitions, view states and (with brokers) last committed task events, and
// the view's offsets: what tells a stall's causes apart (commands never
// applied, tasks never handed out, states never written).
func explainMissing(t *testing.T, db *pgxpool.Pool, brokers []string, ids []string, state string) {
	t.Helper()
	inView := queryMap[string, string](t, db, `SELECT id::text, state FROM dispatcher.tasks WHERE id = ANY($1)`, ids)
	missing := map[int32]map[string]int{}
	for _, id := range ids {
		if inView[id] == state {
			continue
		}
		p := kafka.PartitionOf(id, platformPartitions)
		if missing[p] == nil {
			missing[p] = map[string]int{}
		}
		missing[p][cmp.Or(inView[id], "absent")]++
	}
	var log taskLog
	if len(brokers) > 0 {
		log = readTaskLog(t, brokers)
		inLog := map[string]int{}
		for _, id := range ids {
			if inView[id] == state {
				continue
			}
			last := "no events"
			if recs := log.byTask[id]; len(recs) > 0 {
				last = recs[len(recs)-1].typ.String()
			}
			inLog[last]++
		}
		t.Logf("their last committed task events: %v", inLog)
	}
	// The first few in full: what a stall of a handful of tasks needs to be
	// told apart (delayed, by priority, who created them and when).
	shown := 0
	for _, id := range ids {
		if inView[id] == state || shown == 10 {
			continue
		}
		shown++
		row := queryMap[string, string](t, db, `SELECT id::text, format('priority %s, attempt %s, run_at %s after created_at, `+
			`created %s ago, updated %s ago, idempotency key %s', priority, attempt, run_at - created_at, now() - created_at, `+
			`now() - updated_at, idempotency_key) FROM dispatcher.tasks WHERE id = $1`, id)
		t.Logf("task %s (partition %d): %s; log %+v", id, kafka.PartitionOf(id, platformPartitions), cmp.Or(row[id], "not in the view"),
			log.byTask[id])
	}
	t.Logf("partition owners: %v", partitionOwners(t, db))
	t.Logf("tasks not %s, by partition and view state: %v", state, missing)
	t.Logf("view offsets (partition: events, commands): %v", queryMap[int32, string](t, db,
		`SELECT partition, events_offset || ', ' || commands_offset FROM dispatcher.view_offsets`))
}

// viewStates counts ids by their state in the view.
func viewStates(t *testing.T, db *pgxpool.Pool, ids []string) map[string]int {
	t.Helper()
	return queryMap[string, int](t, db, `SELECT state, count(*) FROM dispatcher.tasks WHERE id = ANY($1) GROUP BY state`, ids)
}

// viewAttempts reads each id's attempt from the view.
func viewAttempts(t *testing.T, db *pgxpool.Pool, ids []string) map[string]int32 {
	t.Helper()
	return queryMap[string, int32](t, db, `SELECT id::text, attempt FROM dispatcher.tasks WHERE id = ANY($1)`, ids)
}

// requireCompletedOnce waits until the view holds every id completed, then
// checks the log and the handler runs:
//   - each task has one CREATED record and one final record, a COMPLETED
//     one, and no record after it;
//   - the view holds the final record's attempt;
//   - the handlers ran each attempt at most once, ran the final attempt and
//     none after it: no task ran again once its completion was recorded,
//     and no attempt handed out was handed out twice.
//
// It returns the log it read and each task's final attempt.
func requireCompletedOnce(t *testing.T, db *pgxpool.Pool, brokers []string, ids []string, runs *attemptRuns) (taskLog, map[string]int32) {
	t.Helper()
	waitViewState(t, db, brokers, ids, "completed")
	log := readTaskLog(t, brokers)
	inView := viewAttempts(t, db, ids)
	finals := make(map[string]int32, len(ids))
	again := 0
	for _, id := range ids {
		recs := log.byTask[id]
		require.NotEmpty(t, recs, "task %s has no records", id)
		created := 0
		for i, r := range recs {
			if r.typ == eventsv1.TaskEventType_TASK_EVENT_TYPE_CREATED {
				created++
			}
			if final(r.typ) {
				require.Equal(t, eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED, r.typ, "task %s", id)
				require.Equal(t, len(recs)-1, i, "task %s has records after its final one: %v", id, recs)
			}
		}
		require.Equal(t, 1, created, "task %s was created %d times", id, created)
		last := recs[len(recs)-1]
		require.True(t, final(last.typ), "task %s ends its log with %v", id, last.typ)
		require.Equal(t, last.attempt, inView[id], "task %s: the view's attempt", id)
		finals[id] = last.attempt

		ran := runs.of(id)
		require.Contains(t, ran, int(last.attempt), "task %s completed at attempt %d, which no handler ran (%v)", id, last.attempt, ran)
		seen := map[int]bool{}
		for _, a := range ran {
			require.False(t, seen[a], "task %s: attempt %d ran twice (%v)", id, a, ran)
			seen[a] = true
			require.LessOrEqual(t, a, int(last.attempt), "task %s ran attempt %d after completing at attempt %d", id, a, last.attempt)
		}
		again += len(ran) - 1
	}
	t.Logf("%d tasks completed once each; %d handler runs beyond each task's first (retries by design and after faults)", len(ids), again)
	return log, finals
}

// requireViewCaughtUp waits until the view has read each events partition
// past the last record log holds of it.
func requireViewCaughtUp(t *testing.T, db *pgxpool.Pool, log taskLog) {
	t.Helper()
	for p, recs := range log.byPartition {
		last := recs[len(recs)-1].offset
		var at int64
		require.Eventually(t, func() bool {
			err := db.QueryRow(context.Background(),
				`SELECT events_offset FROM dispatcher.view_offsets WHERE partition = $1`, p).Scan(&at)
			return err == nil && at > last
		}, 30*time.Second, 20*time.Millisecond, "the view of partition %d stayed at offset %d, the log's last record is at %d", p, at, last)
	}
}

// requireStartedWhenDue checks from the view that no task started before
// it was due and that delayed tasks were due mixedDelay after their
// invocation.
func requireStartedWhenDue(t *testing.T, db *pgxpool.Pool, ids []string) {
	t.Helper()
	var early int
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT count(*) FROM dispatcher.tasks WHERE id = ANY($1) AND started_at < run_at`, ids).Scan(&early))
	require.Zero(t, early, "tasks started before they were due")
	var delayedIDs []string
	for i, id := range ids {
		if delayed(i) {
			delayedIDs = append(delayedIDs, id)
		}
	}
	var short int
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT count(*) FROM dispatcher.tasks WHERE id = ANY($1) AND run_at < created_at + $2::interval`,
		delayedIDs, mixedDelay.String()).Scan(&short))
	require.Zero(t, short, "delayed tasks came due before their delay")
}

// TestPartitionOwnerKilledUnderLoad kills, with SIGKILL, one of two
// dispatcher processes while thousands of tasks are queued, leased,
// delayed and waiting to retry. The other replica finds nothing listening
// at its address and removes it from the group, so its partitions move
// without waiting out its session; the survivor rebuilds them from the
// view and the log. Every task is completed
// once, no attempt runs after its task's completion was recorded, and
// delays survive the move.
func TestPartitionOwnerKilledUnderLoad(t *testing.T) {
	pl := startProcessPlatform(t)
	first := pl.procs["dispatcher"]
	second := pl.addDispatcher(t, "dispatcher-2")
	waitShared(t, pl.env.db, first.grpcAddr, second.grpcAddr)
	client, runs := pl.mixedWorkers(t)

	const n = 2000
	load := startLoad(t, n, 0, invokeMixed(client, "kill"))
	runs.waitEnded(t, n/4)
	killed := owned(partitionOwners(t, pl.env.db), second.grpcAddr)
	require.NotEmpty(t, killed)
	second.sigkill(t)
	killedAt := time.Now()
	t.Logf("killed the owner of partitions %v after %d handler runs", killed, runs.ended.Load())
	// The survivor sees nothing listen at the killed replica's address and
	// removes its member from the group, so the partitions move without
	// waiting for its session to run out.
	require.Eventually(t, func() bool {
		return len(owned(partitionOwners(t, pl.env.db), first.grpcAddr)) == platformPartitions
	}, time.Minute, 20*time.Millisecond, "the surviving replica never took the partitions over")
	t.Logf("the partitions moved %s after the kill", time.Since(killedAt).Round(time.Millisecond))
	out, err := os.ReadFile(first.logs.Name())
	require.NoError(t, err)
	require.Contains(t, string(out), "removed from the group a replica that no longer listens at its address")
	ids := load.wait(t)

	log, _ := requireCompletedOnce(t, pl.env.db, pl.brokers, ids, runs)
	require.Equal(t, []int32{0, 1, 2, 3}, owned(partitionOwners(t, pl.env.db), first.grpcAddr), "the surviving replica owns every partition")
	requireStartedWhenDue(t, pl.env.db, ids)
	requireViewCaughtUp(t, pl.env.db, log)
}

// TestZombieOwnerIsFenced pauses one of two dispatcher processes with
// SIGSTOP past the group's session timeout, lets the other take its
// partitions over, and resumes it with calls for those partitions waiting
// in its sockets: a claim, completions of attempts its workers hold and a
// requeue of a dead letter. The resumed replica claims, completes and
// requeues nothing: its transactions are fenced, so no record it wrote
// after the takeover reaches a read_committed reader, and every task has
// the one final state its real handler gave it.
func TestZombieOwnerIsFenced(t *testing.T) {
	pl := startProcessPlatform(t)
	first := pl.procs["dispatcher"]
	// At info level its log says when it lost, regained and rebuilt
	// partitions, which a failure below prints.
	zombie := pl.addDispatcher(t, "dispatcher-2", "FLO_LOG_LEVEL=info")
	waitShared(t, pl.env.db, first.grpcAddr, zombie.grpcAddr)
	ctx := context.Background()
	client := pl.client(t)
	registerMixed(t, client)
	// The hold tasks' leases outlast the whole test on a loaded box, so
	// only a takeover that dropped them could start a second attempt.
	_, err := client.RegisterAction(ctx, "hold", flo.ActionOptions{Timeout: 5 * time.Minute, MaxAttempts: 3})
	require.NoError(t, err)
	_, err = client.RegisterAction(ctx, "dead", flo.ActionOptions{Timeout: time.Minute, MaxAttempts: 3})
	require.NoError(t, err)

	runs := newAttemptRuns()
	runMixedWorkers(t, pl.gatewayGRPC, runs)
	// Hold handlers keep their attempts until the test lets them go.
	release := make(chan struct{})
	var holdMu sync.Mutex
	holding := map[string]int32{}
	actionWorker(t, pl.gatewayGRPC, flo.ActionWorkerOptions{WorkerID: "holder", Concurrency: 32, BlockMS: claimBlockMS}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("hold", func(actx *flo.ActionContext) ([]byte, error) {
			runs.add(actx.TaskID(), actx.Attempt())
			holdMu.Lock()
			holding[actx.TaskID()] = int32(actx.Attempt())
			holdMu.Unlock()
			<-release
			return actx.Bytes("real")
		})
		w.MustRegisterAction("dead", func(*flo.ActionContext) ([]byte, error) {
			return nil, flo.NewDeadLetterErrorf("dead on arrival")
		})
	})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

	// Tasks of the partitions the zombie will lose: held attempts and dead
	// letters.
	zombieParts := owned(partitionOwners(t, pl.env.db), zombie.grpcAddr)
	ofZombie := func(id string) bool {
		return slices.Contains(zombieParts, kafka.PartitionOf(id, platformPartitions))
	}
	var held, dead, allHeld []string
	for len(held) < 2 {
		id, err := client.Invoke(ctx, "hold", nil)
		require.NoError(t, err)
		allHeld = append(allHeld, id)
		if ofZombie(id) {
			held = append(held, id)
		}
	}
	for len(dead) < 2 {
		id, err := client.Invoke(ctx, "dead", nil)
		require.NoError(t, err)
		if ofZombie(id) {
			dead = append(dead, id)
		}
	}
	waitViewState(t, pl.env.db, pl.brokers, dead, "dead_lettered")
	require.Eventually(t, func() bool {
		holdMu.Lock()
		defer holdMu.Unlock()
		return len(holding) == len(allHeld)
	}, 30*time.Second, 5*time.Millisecond, "the hold tasks never all started")

	// A backlog, part of it in the zombie's memory when it stops.
	const n = 1500
	ids := startLoad(t, n, 0, invokeMixed(client, "zombie")).wait(t)
	runs.waitEnded(t, n/4)

	// A connection to the zombie that is up before it stops, so the calls
	// below wait in its socket. Marked as forwarded, they are never passed
	// on to the new owner: whatever is done, the zombie does.
	conn := harness.DialInternal(t, zombie.grpcAddr)
	direct := dispatcherv1.NewDispatcherClient(conn)
	_, err = direct.ListReplicas(ctx, &dispatcherv1.ListReplicasRequest{})
	require.NoError(t, err)
	callCtx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "x-flo-forwarded", "1"), time.Minute)
	defer cancel()

	// The calls go out once every thread of the zombie has stopped: on a
	// busy box the stop took long enough for a claim sent after the signal
	// to be served, before the zombie lost anything.
	thaw := freeze(t, zombie)
	var calls sync.WaitGroup
	var claimed *dispatcherv1.ClaimResponse
	var claimErr error
	calls.Go(func() {
		claimed, claimErr = direct.Claim(callCtx, &dispatcherv1.ClaimRequest{
			Namespace: "default", Slots: []*dispatcherv1.ClaimSlot{{WorkerId: "zombie-probe", Count: 100}}, Actions: []string{mixedAction},
		})
	})
	reports := make([]*dispatcherv1.Report, len(held))
	holdMu.Lock()
	for i, id := range held {
		reports[i] = &dispatcherv1.Report{TaskId: id, Attempt: holding[id],
			Kind: &dispatcherv1.Report_Completed{Completed: &flov1.Completed{Body: []byte(`"zombie"`)}}}
	}
	holdMu.Unlock()
	var reported *dispatcherv1.ReportResponse
	var reportErr error
	calls.Go(func() {
		reported, reportErr = direct.Report(callCtx, &dispatcherv1.ReportRequest{Namespace: "default", WorkerId: "holder", Reports: reports})
	})
	requeueErrs := make([]error, len(dead))
	for i, id := range dead {
		calls.Go(func() {
			_, requeueErrs[i] = direct.RequeueDeadLetter(callCtx, &flov1.GetTaskRequest{Namespace: "default", TaskId: id})
		})
	}

	// The other replica takes every partition over and serves them: the
	// whole load completes.
	require.Eventually(t, func() bool {
		return len(owned(partitionOwners(t, pl.env.db), first.grpcAddr)) == platformPartitions
	}, time.Minute, 20*time.Millisecond, "the live replica never took the partitions over")
	waitViewState(t, pl.env.db, pl.brokers, ids, "completed")

	// The highest producer epoch of each events partition before the
	// zombie wakes. Once awake it rejoins the group, which may give it
	// partitions again: what it then commits under a transactional id it
	// took anew lies above these epochs, and is a new owner's, not a
	// zombie's. Anything a fenced producer committed would lie at or below.
	woken := map[int32]int16{}
	before := readTaskLog(t, pl.brokers)
	for p, recs := range before.byPartition {
		for _, r := range recs {
			woken[p] = max(woken[p], r.epoch)
		}
	}
	thaw()
	t.Cleanup(func() {
		if t.Failed() {
			logZombie(t, zombie, func(string) bool { return true })
		}
	})
	calls.Wait()
	woke := readTaskLog(t, pl.brokers)
	// Every task was completed before the zombie woke: a claim, a new
	// owner's too, finds nothing.
	if claimErr == nil && len(claimed.GetTasks()) > 0 {
		first := claimed.GetTasks()[0].GetTaskId()
		require.Fail(t, "the zombie handed out tasks", "%d of them; the first, %s, has the records %+v; epochs before it woke %v",
			len(claimed.GetTasks()), first, woke.byTask[first], woken)
	}
	regained := func(id string, typ eventsv1.TaskEventType) bool {
		for _, r := range woke.byTask[id] {
			if r.typ == typ && r.epoch > woken[r.partition] {
				return true
			}
		}
		return false
	}
	completedByWaker := map[string]bool{}
	if reportErr == nil {
		for _, id := range held {
			if !slices.Contains(reported.GetRejectedTaskIds(), id) {
				require.True(t, regained(id, eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED),
					"the zombie accepted the completion of %s without taking its partition anew; its records %+v, epochs before it woke %v",
					id, woke.byTask[id], woken)
				completedByWaker[id] = true
			}
		}
	}
	requeuedByWaker := map[string]bool{}
	for i, err := range requeueErrs {
		if err == nil {
			require.True(t, regained(dead[i], eventsv1.TaskEventType_TASK_EVENT_TYPE_REQUEUED),
				"the zombie requeued dead letter %s without taking its partition anew; its records %+v, before it woke %+v, epochs before it woke %v",
				dead[i], woke.byTask[dead[i]], before.byTask[dead[i]], woken)
			requeuedByWaker[dead[i]] = true
		}
	}
	t.Logf("the zombie answered: claim %v, report %v (rejected %v), requeues %v; as its partitions' owner again: completed %v, requeued %v",
		claimErr, reportErr, reported.GetRejectedTaskIds(), requeueErrs, completedByWaker, requeuedByWaker)

	releaseOnce.Do(func() { close(release) })
	log, finals := requireCompletedOnce(t, pl.env.db, pl.brokers, append(slices.Clone(ids), allHeld...), runs)
	for _, id := range held {
		require.Equal(t, int32(1), finals[id], "held task %s kept its lease through the takeover", id)
		task, err := client.GetTask(ctx, id)
		require.NoError(t, err)
		want := `"real"`
		if completedByWaker[id] {
			want = `"zombie"`
		}
		require.JSONEq(t, want, string(task.Result), "held task %s", id)
	}
	for _, id := range dead {
		// A dead letter requeued by a new owner runs and dies again.
		require.Eventually(t, func() bool {
			task, err := client.GetTask(ctx, id)
			return err == nil && task.Status == flo.TaskDeadLettered
		}, 30*time.Second, 20*time.Millisecond, "dead letter %s", id)
		if requeuedByWaker[id] {
			continue
		}
		for _, r := range log.byTask[id] {
			require.NotEqual(t, eventsv1.TaskEventType_TASK_EVENT_TYPE_REQUEUED, r.typ, "dead letter %s was requeued", id)
		}
	}
	requireEpochsNeverGoBack(t, log, zombieParts)
	// What the zombie did on waking: failed or fenced transactions, or
	// the loss of its partitions noticed first.
	logZombie(t, zombie, func(line string) bool {
		return strings.Contains(line, "ERROR") || strings.Contains(line, "WARN") || strings.Contains(line, "revoked")
	})
}

// freeze stops p with SIGSTOP, as a frozen VM or a long pause would, and
// waits until every thread of it has stopped; thaw resumes it (and the
// test's end does, if the test did not).
func freeze(t *testing.T, p *proc) (thaw func()) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP))
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	waitStopped(t, p.cmd.Process.Pid)
	return func() {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGCONT))
		resumed = true
	}
}

// waitStopped waits until every thread of process pid is stopped (state T
// in /proc).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool {
		stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		require.NoError(t, err)
		for _, path := range stats {
			stat, err := os.ReadFile(path)
			if err != nil {
				return false
			}
			// The state follows the command name, which is in brackets.
			if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] != 'T' {
				return false
			}
		}
		return len(stats) > 0
	}, 10*time.Second, time.Millisecond, "process %d never stopped", pid)
	t.Logf("the zombie's threads all stopped %s after the signal", time.Since(start).Round(time.Microsecond))
}

// logZombie logs the lines of the zombie's log about partitions that keep
// says.
func logZombie(t *testing.T, zombie *proc, keep func(line string) bool) {
	t.Helper()
	out, err := os.ReadFile(zombie.logs.Name())
	if err != nil {
		t.Logf("zombie: log not read: %v", err)
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "partition") && keep(line) {
			t.Logf("zombie: %s", line)
		}
	}
}

// requireEpochsNeverGoBack checks that in each events partition the
// producer epochs of the records read_committed readers see never go
// back: once an owner took a partition's transactional id (bumping its
// epoch, as every transaction also does), nothing an earlier owner wrote
// became visible. moved are partitions that changed owner, whose epochs
// must have grown.
func requireEpochsNeverGoBack(t *testing.T, log taskLog, moved []int32) {
	t.Helper()
	for p, recs := range log.byPartition {
		epochs := []int16{recs[0].epoch}
		for _, r := range recs[1:] {
			require.GreaterOrEqual(t, r.epoch, epochs[len(epochs)-1],
				"partition %d: a record of producer epoch %d at offset %d follows epoch %d", p, r.epoch, r.offset, epochs[len(epochs)-1])
			if r.epoch != epochs[len(epochs)-1] {
				epochs = append(epochs, r.epoch)
			}
		}
		if slices.Contains(moved, p) {
			require.Greater(t, len(epochs), 1, "partition %d moved but all its records have one epoch", p)
		}
		t.Logf("partition %d: %d records, %d producer epochs", p, len(recs), len(epochs))
	}
}

// TestDispatcherInfraRestartUnderLoad restarts the broker, and Postgres,
// while a mixed load is invoked and worked: nothing is lost, every task is
// completed once, and the view catches up with the log.
func TestDispatcherInfraRestartUnderLoad(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restart func(e *env) error
	}{
		{name: "broker", restart: func(e *env) error { return e.broker.Restart() }},
		{name: "postgres", restart: func(*env) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			return harness.Postgres(t).Restart(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			client := e.client(t, "default")
			registerMixed(t, client)
			runs := newAttemptRuns()
			runMixedWorkers(t, e.stack.GatewayGRPCAddr(), runs)
			const n = 1500
			load := startLoad(t, n, 2*time.Millisecond, invokeMixed(client, tc.name))
			load.reach(t, n/3)
			require.NoError(t, tc.restart(e))
			ids := load.wait(t)
			log, _ := requireCompletedOnce(t, e.db, e.stack.KafkaBrokers(), ids, runs)
			requireStartedWhenDue(t, e.db, ids)
			requireViewCaughtUp(t, e.db, log)
		})
	}
}

// TestReplicaAddedAndRemovedUnderLoad adds a second dispatcher process
// while a mixed load runs, and removes it again with SIGTERM: partitions
// move to it and back without losing or doubling anything.
func TestReplicaAddedAndRemovedUnderLoad(t *testing.T) {
	pl := startProcessPlatform(t)
	client, runs := pl.mixedWorkers(t)

	const n = 2000
	load := startLoad(t, n, 20*time.Millisecond, invokeMixed(client, "scale"))
	load.reach(t, n/5)
	added := pl.addDispatcher(t, "dispatcher-2")
	waitShared(t, pl.env.db, pl.procs["dispatcher"].grpcAddr, added.grpcAddr)
	t.Logf("the added replica owns partitions %v", owned(partitionOwners(t, pl.env.db), added.grpcAddr))
	load.reach(t, 3*n/5)
	added.sigterm(t)
	ids := load.wait(t)

	log, _ := requireCompletedOnce(t, pl.env.db, pl.brokers, ids, runs)
	requireStartedWhenDue(t, pl.env.db, ids)
	requireViewCaughtUp(t, pl.env.db, log)
}

// With two dispatcher replicas a busy queue is leased once: the gateway asks
// each replica for its share of a claim. Sent whole to each, as before, a
// claim on a busy queue came back full from both, and nearly every task
// was leased twice and abandoned once. Abandons are left only where a claim
// waiting at both replicas meets the burst.
func TestTwoReplicasLeaseABusyQueueOnce(t *testing.T) {
	pl := startProcessPlatform(t)
	client := pl.client(t)
	const action = "busy"
	require.Eventually(t, func() bool {
		_, err := client.RegisterAction(context.Background(), action, flo.ActionOptions{Timeout: mixedTimeout})
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)
	first := pl.procs["dispatcher"]
	added := pl.addDispatcher(t, "dispatcher-2")
	waitShared(t, pl.env.db, first.grpcAddr, added.grpcAddr)
	for w := range 2 {
		opts := flo.ActionWorkerOptions{WorkerID: fmt.Sprintf("busy-%d", w), Concurrency: 16, BlockMS: claimBlockMS}
		actionWorker(t, pl.gatewayGRPC, opts, func(w *flo.ActionWorker) {
			w.MustRegisterAction(action, func(actx *flo.ActionContext) ([]byte, error) { return nil, nil })
		})
	}
	// The idle workers' claim waits at both replicas once the gateway lists
	// both.
	require.Eventually(t, func() bool {
		for _, p := range []*proc{first, added} {
			if n, ok := scrapeMetrics(t, p.httpAddr).value("flo_dispatcher_claims_waiting"); !ok || n < 1 {
				return false
			}
		}
		return true
	}, time.Minute, 50*time.Millisecond, "the gateway never claimed from both replicas")

	const n = 3000
	payloads := make([]any, 500)
	for i := range payloads {
		payloads[i] = map[string]int{"i": i}
	}
	var ids []string
	for len(ids) < n {
		got, err := client.InvokeMany(t.Context(), action, payloads)
		require.NoError(t, err)
		ids = append(ids, got...)
	}
	waitViewState(t, pl.env.db, pl.brokers, ids, "completed")

	log := readTaskLog(t, pl.brokers)
	abandoned := 0
	for _, id := range ids {
		for _, r := range log.byTask[id] {
			if r.typ == eventsv1.TaskEventType_TASK_EVENT_TYPE_ABANDONED {
				abandoned++
			}
		}
	}
	t.Logf("%d of %d tasks abandoned once", abandoned, n)
	require.Less(t, abandoned, n/20, "tasks leased by two replicas for one claim")
}
