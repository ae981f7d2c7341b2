// Package view is the dispatcher's tasks table as a view of the task-events
// log: the Materializer writes each partition's committed task states into it
// in large batches, with how far it has read each partition, and the reads
// here give a partition's new owner its snapshot (Offsets, LoadLive) and any
// replica a task no owner holds any more (Load, Existing). Postgres is never
// written per task on the hot path.
//
// A state Postgres refuses for the row's sake (a constraint, a trigger that
// raises, a value it cannot store) stops nothing else. A flush that fails so
// writes its batch again in halves, each in a transaction of its own, down to
// the refused rows (about one transaction per halving: 10 for one refused row
// among 1,000); every other row lands; each refused task is logged once and
// counted (flo.dispatcher.view.refused), and its state is kept aside and tried
// again, by Run after 2 s and then further apart up to a minute while none
// lands, and by every Flush, so a fixed cause (a dropped trigger) lets it
// land. A newer state of the task supersedes it, with its payload. Failures
// that are Postgres's or the way to it (a lost or refused connection, SQLSTATE
// classes 08, 40, 53 and 57, a lock timeout: what kafka.IsTransient retries
// and more), and failures a write of no row hits too, keep the whole batch
// for the next try instead.
//
// A refused state holds its partition's offsets back. If the first record
// folded into it is at events offset X of partition p, view_offsets[p] stays
// at most X, so a rebuild replays it from the log, and onFlushed(p, o) keeps o
// below X, since the owner lets go of final tasks up to o: the refused task,
// and every final task of p after it, stay in the owner's memory. Rows of p
// after X are still written (a row only moves forward by view_offset); once
// the refused state lands, or a newer one of its task does, the offsets and
// onFlushed move to where the written states reached.
//
// A live task's state (queued, running, waiting) is held back for up to 2 s
// (liveHold, at most 40,000 states) for a newer one to replace it, so a task
// that ends within that time has its row written once, final, rather than
// once per 100 ms window it lived through. What is held back holds its
// partition's offsets back as a refused state does: view_offsets[p] stays at
// most its first record, and onFlushed(p, o) keeps o below it. The view's
// live rows are thus up to 2 s behind the owners (who answer for live tasks),
// and a rebuild replays up to 2 s more of the log. Flush writes everything,
// held states too.
//
// Two replicas may write the same rows and offsets while a partition moves.
// Each view transaction is bounded (pg.BoundTx, 30 s for a statement and for
// idle time between statements), so a replica paused mid-flush, with row
// locks taken, stalls the new owner's flushes for 30 s at most, not until
// its connection dies.
//
// The materializer's buffer has no bound of its own while Postgres is down
// (flo.dispatcher.view.lag shows it): it keeps one state per task, and every
// task in it is one an owner holds too until the view has it (live, or final
// and not yet let go), so the owners' memory bounds it; only the states of a
// partition the replica gave up stay behind with no owner holding them, until
// they are written.
//
// partition_owners, a row per partition naming the replica that owns it, and
// view_layout, the partition count the rows are keyed by (Layout, Rekey),
// live here too.
package view

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// Offsets returns where a partition's owner resumes: the next events offset
// the view has not read and the next commands offset its states had
// consumed; 0, 0 when the view has nothing of the partition.
func Offsets(ctx context.Context, db store.DB, partition int32) (events, commands int64, err error) {
	err = db.QueryRow(ctx, `SELECT events_offset, commands_offset FROM view_offsets WHERE partition = $1`, partition).Scan(&events, &commands)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read view offsets of partition %d: %w", partition, err)
	}
	return events, commands, nil
}

// taskColumnsOf is what scanTask reads, an engine.Task whole, with payload
// for the payload's column.
func taskColumnsOf(payload string) string {
	return `id, namespace, action, state, priority, ` + payload + `, result, outcome, error, timed_out, error_code,
	idempotency_key, attempt, max_attempts, timeout_ms, backoff_kind, backoff_initial_ms, backoff_max_ms, backoff_multiplier,
	worker_id, trace_context, origin, created_at, run_at, started_at, finished_at, updated_at, lease_until, completion_secret,
	complete_by`
}

// taskColumns is what scanTask reads: an engine.Task whole.
var taskColumns = taskColumnsOf("payload")

// scanTask reads the columns of taskColumns, then those of extra.
func scanTask(r pgx.Row, extra ...any) (engine.Task, error) {
	var (
		t                                 engine.Task
		timeout, initial, maxDelay        int64
		kind                              string
		started, finished, lease, complBy *time.Time
	)
	err := r.Scan(append([]any{&t.ID, &t.Namespace, &t.Action, &t.Status, &t.Priority, &t.Payload, &t.Result, &t.Outcome, &t.Error,
		&t.TimedOut, &t.ErrorCode, &t.IdempotencyKey, &t.Attempt, &t.Settings.MaxAttempts, &timeout, &kind, &initial,
		&maxDelay, &t.Settings.Backoff.Multiplier, &t.WorkerID, &t.TraceContext, &t.Origin, &t.CreatedAt, &t.RunAt,
		&started, &finished, &t.UpdatedAt, &lease, &t.CompletionSecret, &complBy}, extra...)...)
	t.Settings.Timeout = time.Duration(timeout) * time.Millisecond
	t.Settings.Backoff.Kind = backoff.Kind(kind)
	t.Settings.Backoff.Initial = time.Duration(initial) * time.Millisecond
	t.Settings.Backoff.Max = time.Duration(maxDelay) * time.Millisecond
	t.StartedAt, t.FinishedAt, t.LeaseUntil, t.CompleteBy = orZero(started), orZero(finished), orZero(lease), orZero(complBy)
	return t, err
}

// liveColumns is taskColumns for LoadLive: a payload only where kept, and
// whether one was left out.
var liveColumns = taskColumnsOf(`CASE WHEN keep THEN payload ELSE '' END`) + `, NOT keep AND octet_length(payload) > 0`

// Cold is what a new owner learns of one queue's cold tasks.
type Cold struct {
	// N is how many there are.
	N int
	// Due and DueLast are when the queue's first and last delayed queued
	// tasks come due (zero when it has none), held ones among them: the
	// range the cold delayed ones come due in.
	Due, DueLast time.Time
}

// LoadLive reads the tasks of a partition that are not final (queued,
// running, waiting), for the partition's new owner, in the one snapshot db
// reads (a repeatable-read transaction), calls fn with each, and returns
// what it left in the view of each queue ({namespace, action}): the queued
// tasks past limits.QueuedTasks in hand-out order (ready ones by priority,
// due time, creation and id, then delayed ones by due time), which the
// owner counts cold (engine.Partition.SetCold). The payloads of
// the others are read only as far as limits let the owner hold them: those
// of queued tasks due by now plus the horizon, in the same order, up to
// the bound in all. Every other task with a payload comes with PayloadOut
// set; a claim reads it from the view. With no limits every task comes
// whole.
func LoadLive(ctx context.Context, db store.DB, partition int32, limits engine.Limits, now time.Time, fn func(t engine.Task)) (map[[2]string]Cold, error) {
	// Zero means no bound, as in engine.Limits; a NULL limit is none.
	var dueBy *time.Time
	if limits.Horizon > 0 {
		d := now.Add(limits.Horizon)
		dueBy = &d
	}
	var bound *int
	if limits.QueuedTasks > 0 {
		bound = &limits.QueuedTasks
	}
	// The queued tasks come from the hand-out indexes, as many as the bound
	// from each (LoadCold's order), so a backlog past it is neither read
	// nor sorted.
	rows, err := db.Query(ctx, `SELECT `+liveColumns+` FROM (
	SELECT *, NOT $2 OR (held AND ($3::bigint = 0 OR sum(octet_length(payload)) FILTER (WHERE held) OVER w <= $3)) AS keep,
		state = 'queued' AND $6::bigint IS NOT NULL AND count(*) FILTER (WHERE state = 'queued') OVER w > $6 AS past
	FROM (
		SELECT *, state = 'queued' AND ($4::timestamptz IS NULL OR run_at <= $4) AS held, run_at <= $5 AS due FROM (
			(SELECT * FROM tasks WHERE partition = $1 AND state = 'queued' AND run_at <= $5
				ORDER BY priority DESC, run_at, created_at, id LIMIT $6)
			UNION ALL
			(SELECT * FROM tasks WHERE partition = $1 AND state = 'queued' AND run_at > $5 ORDER BY run_at, id LIMIT $6)
			UNION ALL
			SELECT * FROM tasks WHERE partition = $1 AND state IN ('running', 'waiting')
		) rows
	) live
	WINDOW w AS (ORDER BY held DESC, due DESC, CASE WHEN due THEN priority END DESC, run_at, created_at, id
		ROWS UNBOUNDED PRECEDING)
) kept WHERE NOT past`, partition, limits.PayloadBytes > 0 || limits.Horizon > 0, limits.PayloadBytes, dueBy, now, bound)
	if err != nil {
		return nil, fmt.Errorf("load live tasks of partition %d: %w", partition, err)
	}
	queued, held := 0, map[[2]string]int{}
	for rows.Next() {
		var left bool
		t, err := scanTask(rows, &left)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("load live tasks of partition %d: %w", partition, err)
		}
		t.PayloadOut = left
		if t.Status == store.Queued {
			queued++
			held[[2]string{t.Namespace, t.Action}]++
		}
		fn(t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load live tasks of partition %d: %w", partition, err)
	}
	if bound == nil || queued < *bound {
		return nil, nil
	}
	rows, err = db.Query(ctx, `SELECT namespace, action, count(*),
		min(run_at) FILTER (WHERE run_at > $2), max(run_at) FILTER (WHERE run_at > $2)
	FROM tasks WHERE partition = $1 AND state = 'queued' GROUP BY namespace, action`, partition, now)
	if err != nil {
		return nil, fmt.Errorf("count queued tasks of partition %d: %w", partition, err)
	}
	cold := map[[2]string]Cold{}
	var (
		q         [2]string
		all       int
		due, last *time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&q[0], &q[1], &all, &due, &last}, func() error {
		if n := all - held[q]; n > 0 {
			c := Cold{N: n}
			if due != nil {
				c.Due, c.DueLast = *due, *last
			}
			cold[q] = c
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count queued tasks of partition %d: %w", partition, err)
	}
	return cold, nil
}

// QueuedAmong counts, per queue ({namespace, action}), the tasks of ids that
// db has queued in the partition. In the snapshot LoadLive read, those it
// left out are the ones it counted cold: a rebuild's replay that takes one
// in again (a record of it follows the snapshot's offset) takes it off its
// queue's count, and only those. The view writes a final state without
// waiting while a live one holds its partition's offsets back, so a task
// replayed may as well be one the snapshot already had final, which no
// queue counted.
func QueuedAmong(ctx context.Context, db store.DB, partition int32, ids []uuid.UUID) (map[[2]string]int, error) {
	out := map[[2]string]int{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, `SELECT namespace, action, count(*) FROM tasks
	WHERE id = ANY($2::uuid[]) AND partition = $1 AND state = 'queued' GROUP BY namespace, action`, partition, ids)
	if err != nil {
		return nil, fmt.Errorf("count queued tasks among %d of partition %d: %w", len(ids), partition, err)
	}
	var (
		q [2]string
		n int
	)
	if _, err := pgx.ForEachRow(rows, []any{&q[0], &q[1], &n}, func() error {
		out[q] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count queued tasks among %d of partition %d: %w", len(ids), partition, err)
	}
	return out, nil
}

// LoadCold reads back a partition's cold tasks whole, for w: its next
// queued tasks in hand-out order that the partition did not hold when w
// began, the ready ones first (priority, due time, creation, id), then the
// delayed ones soonest due, w.N at most; for a read of one queue, that
// queue's next ready ones (from w.From on, or before w.Before, when set).
// Each query is one range of an index in order; the next one reads what
// the last left to read.
func LoadCold(ctx context.Context, db store.DB, partition int32, w *engine.Warming) ([]engine.Task, error) {
	// The held tasks go in as a set Postgres hashes once: the scans read
	// them among the first rows in hand-out order.
	const held = `id NOT IN (SELECT unnest($2::uuid[]))`
	type read struct {
		sql  string
		args []any
	}
	args := []any{partition, w.Held, w.Now, w.N}
	reads := []read{
		{`SELECT ` + taskColumns + ` FROM tasks WHERE partition = $1 AND state = 'queued' AND run_at <= $3 AND ` + held + `
		ORDER BY priority DESC, run_at, created_at, id LIMIT $4`, args},
		{`SELECT ` + taskColumns + ` FROM tasks WHERE partition = $1 AND state = 'queued' AND run_at > $3 AND ` + held + `
		ORDER BY run_at, id LIMIT $4`, args},
	}
	what := fmt.Sprintf("partition %d", partition)
	if w.OneQueue() {
		what = fmt.Sprintf("%s/%s in partition %d", w.Namespace, w.Action, partition)
		queue := `SELECT ` + taskColumns + ` FROM tasks WHERE partition = $1 AND namespace = $5 AND action = $6
		AND state = 'queued' AND run_at <= $3 AND ` + held
		args = append(args, w.Namespace, w.Action)
		reads = []read{{queue + ` ORDER BY priority DESC, run_at, created_at, id LIMIT $4`, args}}
		if f := w.From; f != nil {
			// The rest of From's priority, then the lower ones: one
			// condition over both would not be one range of the index.
			reads = []read{
				{queue + ` AND priority = $7 AND (run_at, created_at, id) >= ($8, $9, $10)
		ORDER BY run_at, created_at, id LIMIT $4`, slices.Concat(args, []any{f.Priority, f.RunAt, f.CreatedAt, f.ID})},
				{queue + ` AND priority < $7 ORDER BY priority DESC, run_at, created_at, id LIMIT $4`,
					slices.Concat(args, []any{f.Priority})},
			}
		}
		if b := w.Before; b != nil {
			// The higher priorities, then the start of Before's.
			reads = []read{
				{queue + ` AND priority > $7 ORDER BY priority DESC, run_at, created_at, id LIMIT $4`,
					slices.Concat(args, []any{b.Priority})},
				{queue + ` AND priority = $7 AND (run_at, created_at, id) < ($8, $9, $10)
		ORDER BY run_at, created_at, id LIMIT $4`, slices.Concat(args, []any{b.Priority, b.RunAt, b.CreatedAt, b.ID})},
			}
		}
	}
	var out []engine.Task
	for _, r := range reads {
		if len(out) == w.N {
			break
		}
		r.args[3] = w.N - len(out)
		rows, err := db.Query(ctx, r.sql, r.args...)
		if err != nil {
			return nil, fmt.Errorf("read cold tasks of %s: %w", what, err)
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.Task, error) { return scanTask(r) })
		if err != nil {
			return nil, fmt.Errorf("read cold tasks of %s: %w", what, err)
		}
		out = append(out, got...)
	}
	return out, nil
}

// Load reads one task of a namespace whole, and the last events offset the
// view held when it was read (-1 before any): an owner that let the task go
// at or before that offset knows the row is the task's last state. A row
// from before log-first dispatch (partition -1) no record has changed since
// is its task's last state whatever the offsets: its viewed offset is the
// largest there is. pg.ErrNotFound when the view has none.
func Load(ctx context.Context, db store.DB, namespace string, id uuid.UUID) (engine.Task, int64, error) {
	var viewed int64
	t, err := scanTask(db.QueryRow(ctx, `SELECT `+taskColumns+`,
	CASE WHEN partition < 0 THEN 9223372036854775807
		ELSE coalesce((SELECT events_offset FROM view_offsets o WHERE o.partition = tasks.partition), 0) - 1 END
	FROM tasks WHERE id = $1 AND namespace = $2`, id, namespace), &viewed)
	if err != nil {
		return engine.Task{}, 0, fmt.Errorf("load task %s: %w", id, pg.MapError(err))
	}
	return t, viewed, nil
}

// Existing reports which of ids the view has, in any namespace.
func Existing(ctx context.Context, db store.DB, ids []uuid.UUID) (map[uuid.UUID]bool, error) {
	rows, err := db.Query(ctx, `SELECT id FROM tasks WHERE id = ANY($1::uuid[])`, ids)
	if err != nil {
		return nil, fmt.Errorf("look up tasks: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("look up tasks: %w", err)
	}
	out := make(map[uuid.UUID]bool, len(found))
	for _, id := range found {
		out[id] = true
	}
	return out, nil
}

// Payloads reads the payloads of tasks, for a claim of tasks whose owner let
// their payloads go from memory (engine.Limits); a task the view lacks is
// missing from the map.
func Payloads(ctx context.Context, db store.DB, ids []uuid.UUID) (map[uuid.UUID][]byte, error) {
	rows, err := db.Query(ctx, `SELECT id, payload FROM tasks WHERE id = ANY($1::uuid[])`, ids)
	if err != nil {
		return nil, fmt.Errorf("read task payloads: %w", err)
	}
	out := make(map[uuid.UUID][]byte, len(ids))
	var (
		id      uuid.UUID
		payload []byte
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &payload}, func() error {
		out[id] = payload
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read task payloads: %w", err)
	}
	return out, nil
}

// orZero turns a nullable timestamp into the zero time for NULL.
func orZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
