package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/libs/pg"
)

// NewTask is one task to insert, with the settings of its action copied in.
type NewTask struct {
	ID             uuid.UUID
	Namespace      string
	Action         string
	Payload        []byte
	IdempotencyKey string
	Priority       int32
	Settings       Settings
	TraceContext   map[string]string
	Origin         string
	CreatedAt      time.Time
	// RunAt is when the task becomes claimable; zero means now (the database's clock).
	RunAt time.Time
}

// InsertTasks inserts tasks in one statement, skipping ids that already exist,
// and returns the tasks it created.
func InsertTasks(ctx context.Context, db DB, tasks []NewTask) ([]Change, error) {
	n := len(tasks)
	var (
		ids        = make([]uuid.UUID, n)
		namespaces = make([]string, n)
		actions    = make([]string, n)
		payloads   = make([][]byte, n)
		keys       = make([]string, n)
		priorities = make([]int32, n)
		maxAtt     = make([]int32, n)
		timeouts   = make([]int64, n)
		kinds      = make([]string, n)
		initials   = make([]int64, n)
		maxDelays  = make([]int64, n)
		mults      = make([]float64, n)
		traces     = make([]string, n)
		created    = make([]time.Time, n)
		runAts     = make([]pgtype.Timestamptz, n)
		origins    = make([]string, n)
	)
	for i, t := range tasks {
		trace, err := json.Marshal(t.TraceContext)
		if err != nil {
			return nil, fmt.Errorf("encode trace context of task %s: %w", t.ID, err)
		}
		ids[i], namespaces[i], actions[i], payloads[i], keys[i], priorities[i] = t.ID, t.Namespace, t.Action, t.Payload, t.IdempotencyKey, t.Priority
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		s := t.Settings
		maxAtt[i], timeouts[i] = s.MaxAttempts, ms(s.Timeout)
		kinds[i], initials[i], maxDelays[i], mults[i] = string(s.Backoff.Kind), ms(s.Backoff.Initial), ms(s.Backoff.Max), s.Backoff.Multiplier
		traces[i], created[i] = string(trace), t.CreatedAt
		runAts[i] = pgtype.Timestamptz{Time: t.RunAt, Valid: !t.RunAt.IsZero()}
		origins[i] = t.Origin
	}
	rows, err := db.Query(ctx, `
INSERT INTO tasks AS t (id, namespace, action, state, payload, idempotency_key, priority, max_attempts, timeout_ms,
	backoff_kind, backoff_initial_ms, backoff_max_ms, backoff_multiplier, trace_context, created_at, run_at, origin)
SELECT r.id, r.namespace, r.action, 'queued', r.payload, r.idempotency_key, r.priority, r.max_attempts, r.timeout_ms,
	r.backoff_kind, r.backoff_initial_ms, r.backoff_max_ms, r.backoff_multiplier, r.trace_context::jsonb, r.created_at,
	COALESCE(r.run_at, now()), r.origin
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::int[], $7::int[], $8::bigint[],
	$9::text[], $10::bigint[], $11::bigint[], $12::float8[], $13::text[], $14::timestamptz[], $15::timestamptz[], $16::text[])
	AS r(id, namespace, action, payload, idempotency_key, priority, max_attempts, timeout_ms,
	backoff_kind, backoff_initial_ms, backoff_max_ms, backoff_multiplier, trace_context, created_at, run_at, origin)
ON CONFLICT (id) DO NOTHING
RETURNING `+changeColumns,
		ids, namespaces, actions, payloads, keys, priorities, maxAtt, timeouts, kinds, initials, maxDelays, mults, traces, created, runAts, origins)
	if err != nil {
		return nil, fmt.Errorf("insert tasks: %w", err)
	}
	out, err := collectChanges(rows)
	if err != nil {
		return nil, fmt.Errorf("insert tasks: %w", err)
	}
	return out, nil
}

// ClaimGroup asks for queued tasks of one namespace and set of actions on
// behalf of several claimers: each slot is room for one task, and the task
// placed in a slot is leased to that slot's worker.
type ClaimGroup struct {
	Namespace string
	Actions   []string
	Slots     []ClaimSlot
}

// ClaimSlot is room for one task.
type ClaimSlot struct {
	WorkerID string
	// Lease is the lease length; zero means the task's own timeout.
	Lease time.Duration
}

// Claimed is a task a claim moved to running.
type Claimed struct {
	Change
	// Slot is the index of the ClaimSlot the task was placed in.
	Slot        int
	Payload     []byte
	MaxAttempts int32
	LeaseUntil  time.Time
	// CompletionSecret is drawn for this attempt; with the id and attempt
	// it makes the attempt's completion token.
	CompletionSecret []byte
}

// claimSQL takes the best queued tasks of a set of actions. Each action is
// read through its own ordered index scan (the LATERAL), so a claim costs
// what it takes, not the length of the backlog; slots are filled in hand-out
// order (priority, then run_at, then creation).
const claimSQL = `
WITH locked AS (
	SELECT c.id, c.priority, c.run_at, c.created_at
	FROM unnest($2::text[]) AS a(action)
	CROSS JOIN LATERAL (
		SELECT id, priority, run_at, created_at FROM tasks
		WHERE namespace = $1 AND action = a.action AND state = 'queued' AND run_at <= now()
		ORDER BY priority DESC, run_at, created_at
		LIMIT $3
		FOR UPDATE SKIP LOCKED
	) c
), picked AS (
	SELECT id, row_number() OVER (ORDER BY priority DESC, run_at, created_at) AS slot
	FROM locked
	ORDER BY priority DESC, run_at, created_at
	LIMIT $3
)
UPDATE tasks t SET
	state = 'running',
	attempt = t.attempt + 1,
	worker_id = ($4::text[])[p.slot],
	lease_until = now() + (CASE WHEN ($5::bigint[])[p.slot] > 0 THEN ($5::bigint[])[p.slot] ELSE t.timeout_ms END) * interval '1 millisecond',
	started_at = now(),
	completion_secret = uuid_send(gen_random_uuid()),
	updated_at = now()
FROM picked p WHERE t.id = p.id
RETURNING p.slot, ` + changeColumns + `, t.payload, t.max_attempts, t.lease_until, t.completion_secret`

// ClaimTasks runs one claim statement per group in a single batch (one round
// trip) and returns the tasks each group got, in group order. Statements run
// in order inside the caller's transaction, so no two slots get the same task.
func ClaimTasks(ctx context.Context, db DB, groups []ClaimGroup) ([][]Claimed, error) {
	b := &pgx.Batch{}
	for _, g := range groups {
		workers := make([]string, len(g.Slots))
		leases := make([]int64, len(g.Slots))
		for i, s := range g.Slots {
			workers[i], leases[i] = s.WorkerID, ms(s.Lease)
		}
		b.Queue(claimSQL, g.Namespace, g.Actions, len(g.Slots), workers, leases)
	}
	br := db.SendBatch(ctx, b)
	out := make([][]Claimed, len(groups))
	for i := range groups {
		rows, err := br.Query()
		if err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("claim tasks: %w", err)
		}
		for rows.Next() {
			var (
				c    Claimed
				slot int64
			)
			if err := rows.Scan(append([]any{&slot}, append(changeDest(&c.Change), &c.Payload, &c.MaxAttempts, &c.LeaseUntil, &c.CompletionSecret)...)...); err != nil {
				rows.Close()
				_ = br.Close()
				return nil, fmt.Errorf("scan claimed task: %w", err)
			}
			c.Slot = int(slot - 1)
			out[i] = append(out[i], c)
		}
		if err := rows.Err(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("claim tasks: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("claim tasks: %w", err)
	}
	return out, nil
}

// Completion finishes one running attempt successfully.
type Completion struct {
	ID        uuid.UUID
	Namespace string
	Attempt   int32
	Result    []byte
	Outcome   string
}

// CompleteTasks marks the matching running attempts completed in one
// statement and returns the tasks it changed; completions that match no
// running attempt change nothing.
func CompleteTasks(ctx context.Context, db DB, cs []Completion) ([]Change, error) {
	n := len(cs)
	ids, namespaces, attempts, results, outcomes := make([]uuid.UUID, n), make([]string, n), make([]int32, n), make([][]byte, n), make([]string, n)
	for i, c := range cs {
		ids[i], namespaces[i], attempts[i], results[i], outcomes[i] = c.ID, c.Namespace, c.Attempt, c.Result, c.Outcome
		if results[i] == nil {
			results[i] = []byte{}
		}
	}
	rows, err := db.Query(ctx, `
UPDATE tasks t SET state = 'completed', result = r.result, outcome = r.outcome, error = '', timed_out = false, error_code = '',
	lease_until = NULL, finished_at = now(), updated_at = now()
FROM unnest($1::uuid[], $2::text[], $3::int[], $4::bytea[], $5::text[]) AS r(id, namespace, attempt, result, outcome)
WHERE t.id = r.id AND t.namespace = r.namespace AND t.attempt = r.attempt AND t.state = 'running'
RETURNING `+changeColumns, ids, namespaces, attempts, results, outcomes)
	if err != nil {
		return nil, fmt.Errorf("complete tasks: %w", err)
	}
	out, err := collectChanges(rows)
	if err != nil {
		return nil, fmt.Errorf("complete tasks: %w", err)
	}
	return out, nil
}

// RunningTask is what deciding a failed attempt's fate needs.
type RunningTask struct {
	ID          uuid.UUID
	Namespace   string
	Attempt     int32
	MaxAttempts int32
	Backoff     backoff.Policy
}

// LockRunning locks the running tasks among ids for the rest of the
// transaction and returns them.
func LockRunning(ctx context.Context, db DB, ids []uuid.UUID) ([]RunningTask, error) {
	rows, err := db.Query(ctx, `
SELECT id, namespace, attempt, max_attempts, backoff_kind, backoff_initial_ms, backoff_max_ms, backoff_multiplier
FROM tasks WHERE id = ANY($1::uuid[]) AND state = 'running'
FOR UPDATE`, ids)
	if err != nil {
		return nil, fmt.Errorf("lock running tasks: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RunningTask, error) {
		var (
			t                 RunningTask
			kind              string
			initial, maxDelay int64
		)
		err := r.Scan(&t.ID, &t.Namespace, &t.Attempt, &t.MaxAttempts, &kind, &initial, &maxDelay, &t.Backoff.Multiplier)
		t.Backoff.Kind, t.Backoff.Initial, t.Backoff.Max = backoff.Kind(kind), fromMS(initial), fromMS(maxDelay)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("lock running tasks: %w", err)
	}
	return out, nil
}

// Disposition moves a running task that did not complete to its next state.
type Disposition struct {
	ID uuid.UUID
	// Status is Queued, Waiting, Failed or DeadLettered.
	Status Status
	// Delay is how long a queued task waits before it can be claimed again,
	// or how long a waiting one waits for its result.
	Delay time.Duration
	// Uncount takes the attempt back (abandon).
	Uncount bool
	// Error, TimedOut and ErrorCode replace the task's unless KeepError is set.
	Error     string
	TimedOut  bool
	ErrorCode string
	KeepError bool
}

// DisposeTasks applies dispositions to tasks the caller locked with
// LockRunning, in one statement.
func DisposeTasks(ctx context.Context, db DB, ds []Disposition) ([]Change, error) {
	n := len(ds)
	ids, states, uncount, errs, delays := make([]uuid.UUID, n), make([]string, n), make([]int32, n), make([]pgtype.Text, n), make([]int64, n)
	timedOut, codes := make([]pgtype.Bool, n), make([]pgtype.Text, n)
	for i, d := range ds {
		ids[i], states[i], delays[i] = d.ID, string(d.Status), ms(d.Delay)
		if d.Uncount {
			uncount[i] = 1
		}
		errs[i] = pgtype.Text{String: d.Error, Valid: !d.KeepError}
		timedOut[i] = pgtype.Bool{Bool: d.TimedOut, Valid: !d.KeepError}
		codes[i] = pgtype.Text{String: d.ErrorCode, Valid: !d.KeepError}
	}
	rows, err := db.Query(ctx, `
UPDATE tasks t SET
	state = u.state,
	attempt = t.attempt - u.uncount,
	error = COALESCE(u.error, t.error),
	timed_out = COALESCE(u.timed_out, t.timed_out),
	error_code = COALESCE(u.error_code, t.error_code),
	run_at = CASE WHEN u.state = 'queued' THEN now() + u.delay_ms * interval '1 millisecond' ELSE t.run_at END,
	complete_by = CASE WHEN u.state = 'waiting' THEN now() + u.delay_ms * interval '1 millisecond' END,
	finished_at = CASE WHEN u.state IN ('queued', 'waiting') THEN NULL ELSE now() END,
	lease_until = NULL,
	updated_at = now()
FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[], $5::bigint[], $6::bool[], $7::text[]) AS u(id, state, uncount, error, delay_ms, timed_out, error_code)
WHERE t.id = u.id AND t.state = 'running'
RETURNING `+changeColumns, ids, states, uncount, errs, delays, timedOut, codes)
	if err != nil {
		return nil, fmt.Errorf("dispose tasks: %w", err)
	}
	out, err := collectChanges(rows)
	if err != nil {
		return nil, fmt.Errorf("dispose tasks: %w", err)
	}
	return out, nil
}

// ExpireLeases requeues (or dead-letters, when no attempt is left) up to
// limit running tasks whose lease has passed. SKIP LOCKED lets every replica
// run it at once without taking the same rows.
func ExpireLeases(ctx context.Context, db DB, limit int) ([]Change, error) {
	rows, err := db.Query(ctx, `
WITH expired AS (
	SELECT id FROM tasks
	WHERE state = 'running' AND lease_until < now()
	ORDER BY lease_until
	LIMIT $1
	FOR UPDATE SKIP LOCKED
)
UPDATE tasks t SET
	state = CASE WHEN t.attempt >= t.max_attempts THEN 'dead_lettered' ELSE 'queued' END,
	run_at = CASE WHEN t.attempt >= t.max_attempts THEN t.run_at ELSE now() END,
	finished_at = CASE WHEN t.attempt >= t.max_attempts THEN now() END,
	error = 'lease expired',
	timed_out = true,
	error_code = '',
	lease_until = NULL,
	updated_at = now()
FROM expired WHERE t.id = expired.id
RETURNING `+changeColumns, limit)
	if err != nil {
		return nil, fmt.Errorf("expire leases: %w", err)
	}
	out, err := collectChanges(rows)
	if err != nil {
		return nil, fmt.Errorf("expire leases: %w", err)
	}
	return out, nil
}

// ExtendLease moves a running attempt's lease to now+extend (zero: the task's
// timeout) and returns the new deadline; pg.ErrNotFound when the attempt is not running.
func ExtendLease(ctx context.Context, db DB, namespace string, id uuid.UUID, attempt int32, extend time.Duration) (time.Time, error) {
	var until time.Time
	err := db.QueryRow(ctx, `
UPDATE tasks SET
	lease_until = now() + (CASE WHEN $4::bigint > 0 THEN $4::bigint ELSE timeout_ms END) * interval '1 millisecond',
	updated_at = now()
WHERE id = $1 AND namespace = $2 AND attempt = $3 AND state = 'running'
RETURNING lease_until`, id, namespace, attempt, ms(extend)).Scan(&until)
	if err != nil {
		return time.Time{}, fmt.Errorf("extend lease of task %s: %w", id, pg.MapError(err))
	}
	return until, nil
}

const taskColumns = `id, namespace, action, state, priority, payload, result, outcome, error, timed_out, error_code, idempotency_key, attempt, max_attempts,
	worker_id, created_at, run_at, started_at, finished_at, updated_at, CASE WHEN state = 'waiting' THEN complete_by END`

func scanTask(r pgx.Row) (Task, error) {
	var (
		t                             Task
		started, finished, completeBy *time.Time
	)
	err := r.Scan(&t.ID, &t.Namespace, &t.Action, &t.Status, &t.Priority, &t.Payload, &t.Result, &t.Outcome, &t.Error, &t.TimedOut, &t.ErrorCode,
		&t.IdempotencyKey, &t.Attempt, &t.MaxAttempts, &t.WorkerID, &t.CreatedAt, &t.RunAt, &started, &finished, &t.UpdatedAt, &completeBy)
	t.StartedAt, t.FinishedAt, t.CompleteBy = timeOrZero(started), timeOrZero(finished), timeOrZero(completeBy)
	return t, err
}

// GetTask reads one task of a namespace; pg.ErrNotFound when there is none.
func GetTask(ctx context.Context, db DB, namespace string, id uuid.UUID) (Task, error) {
	t, err := scanTask(db.QueryRow(ctx, `SELECT `+taskColumns+` FROM tasks WHERE id = $1 AND namespace = $2`, id, namespace))
	if err != nil {
		return Task{}, fmt.Errorf("select task %s: %w", id, pg.MapError(err))
	}
	return t, nil
}

// DeadLetterKey is where a listing of dead letters resumes: after the task
// with this update time and id. The zero key starts at the newest.
type DeadLetterKey struct {
	UpdatedAt time.Time
	ID        uuid.UUID
}

// ListDeadLetters returns up to limit of a namespace's dead letters after
// key, newest first, of one action or of all when action is empty.
func ListDeadLetters(ctx context.Context, db DB, namespace, action string, after DeadLetterKey, limit int) ([]Task, error) {
	var afterAt *time.Time
	if !after.UpdatedAt.IsZero() {
		afterAt = &after.UpdatedAt
	}
	// Two statements rather than "($2 = '' OR action = $2)" so each gets a
	// plan that uses the dead-letter index.
	var (
		rows pgx.Rows
		err  error
	)
	if action == "" {
		rows, err = db.Query(ctx, `
SELECT `+taskColumns+` FROM tasks
WHERE namespace = $1 AND state = 'dead_lettered' AND ($2::timestamptz IS NULL OR (updated_at, id) < ($2, $3))
ORDER BY updated_at DESC, id DESC
LIMIT $4`, namespace, afterAt, after.ID, limit)
	} else {
		rows, err = db.Query(ctx, `
SELECT `+taskColumns+` FROM tasks
WHERE namespace = $1 AND action = $2 AND state = 'dead_lettered' AND ($3::timestamptz IS NULL OR (updated_at, id) < ($3, $4))
ORDER BY updated_at DESC, id DESC
LIMIT $5`, namespace, action, afterAt, after.ID, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("select dead letters of %s: %w", namespace, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Task, error) { return scanTask(r) })
	if err != nil {
		return nil, fmt.Errorf("scan dead letters of %s: %w", namespace, err)
	}
	return out, nil
}

// RequeueDeadLetter queues a dead-lettered task again from attempt zero with
// its error cleared; pg.ErrNotFound when the task is not dead-lettered.
func RequeueDeadLetter(ctx context.Context, db DB, namespace string, id uuid.UUID) (Change, error) {
	var c Change
	err := db.QueryRow(ctx, `
UPDATE tasks t SET state = 'queued', attempt = 0, error = '', timed_out = false, error_code = '', run_at = now(), finished_at = NULL,
	lease_until = NULL, updated_at = now()
WHERE t.id = $1 AND t.namespace = $2 AND t.state = 'dead_lettered'
RETURNING `+changeColumns, id, namespace).Scan(changeDest(&c)...)
	if err != nil {
		return Change{}, fmt.Errorf("requeue task %s: %w", id, pg.MapError(err))
	}
	return c, nil
}
