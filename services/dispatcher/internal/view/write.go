package view

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// upsertSQL writes a batch of task states, one row per task. A row only moves
// forward (a state from an older record never overwrites a newer one), and a
// state without payload or result (every record but CREATED, REQUEUED and the
// final one) keeps the stored ones. The payload column is NOT NULL, so a
// missing payload travels as empty bytes.
const upsertSQL = `
INSERT INTO tasks AS t (id, partition, view_offset, namespace, action, state, priority, payload, result, outcome, error,
	timed_out, error_code, idempotency_key, attempt, max_attempts, timeout_ms, backoff_kind, backoff_initial_ms,
	backoff_max_ms, backoff_multiplier, worker_id, trace_context, origin, created_at, run_at, started_at, finished_at,
	updated_at, lease_until, completion_secret, complete_by)
SELECT r.id, r.partition, r.view_offset, r.namespace, r.action, r.state, r.priority, r.payload, r.result, r.outcome, r.error,
	r.timed_out, r.error_code, r.idempotency_key, r.attempt, r.max_attempts, r.timeout_ms, r.backoff_kind, r.backoff_initial_ms,
	r.backoff_max_ms, r.backoff_multiplier, r.worker_id, r.trace_context::jsonb, r.origin, r.created_at, r.run_at, r.started_at,
	r.finished_at, COALESCE(r.updated_at, now()), r.lease_until, r.completion_secret, r.complete_by
FROM unnest($1::uuid[], $2::int[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::int[], $8::bytea[], $9::bytea[],
	$10::text[], $11::text[], $12::bool[], $13::text[], $14::text[], $15::int[], $16::int[], $17::bigint[], $18::text[],
	$19::bigint[], $20::bigint[], $21::float8[], $22::text[], $23::text[], $24::text[], $25::timestamptz[], $26::timestamptz[],
	$27::timestamptz[], $28::timestamptz[], $29::timestamptz[], $30::timestamptz[], $31::bytea[], $32::timestamptz[])
	AS r(id, partition, view_offset, namespace, action, state, priority, payload, result, outcome, error,
	timed_out, error_code, idempotency_key, attempt, max_attempts, timeout_ms, backoff_kind, backoff_initial_ms,
	backoff_max_ms, backoff_multiplier, worker_id, trace_context, origin, created_at, run_at, started_at, finished_at,
	updated_at, lease_until, completion_secret, complete_by)
ON CONFLICT (id) DO UPDATE SET
	partition = EXCLUDED.partition, view_offset = EXCLUDED.view_offset, namespace = EXCLUDED.namespace,
	action = EXCLUDED.action, state = EXCLUDED.state, priority = EXCLUDED.priority,
	payload = CASE WHEN octet_length(EXCLUDED.payload) > 0 THEN EXCLUDED.payload ELSE t.payload END,
	result = COALESCE(EXCLUDED.result, t.result), outcome = EXCLUDED.outcome, error = EXCLUDED.error,
	timed_out = EXCLUDED.timed_out, error_code = EXCLUDED.error_code, idempotency_key = EXCLUDED.idempotency_key,
	attempt = EXCLUDED.attempt, max_attempts = EXCLUDED.max_attempts, timeout_ms = EXCLUDED.timeout_ms,
	backoff_kind = EXCLUDED.backoff_kind, backoff_initial_ms = EXCLUDED.backoff_initial_ms,
	backoff_max_ms = EXCLUDED.backoff_max_ms, backoff_multiplier = EXCLUDED.backoff_multiplier,
	worker_id = EXCLUDED.worker_id, trace_context = EXCLUDED.trace_context, origin = EXCLUDED.origin,
	created_at = EXCLUDED.created_at, run_at = EXCLUDED.run_at, started_at = EXCLUDED.started_at,
	finished_at = EXCLUDED.finished_at, updated_at = EXCLUDED.updated_at, lease_until = EXCLUDED.lease_until,
	completion_secret = EXCLUDED.completion_secret, complete_by = EXCLUDED.complete_by
WHERE t.view_offset < EXCLUDED.view_offset`

// offsetsSQL moves each partition's offsets forward only: a flush of states
// a previous owner wrote already never takes the view back.
const offsetsSQL = `
INSERT INTO view_offsets AS v (partition, events_offset, commands_offset)
SELECT * FROM unnest($1::int[], $2::bigint[], $3::bigint[])
ON CONFLICT (partition) DO UPDATE SET
	events_offset = GREATEST(v.events_offset, EXCLUDED.events_offset),
	commands_offset = GREATEST(v.commands_offset, EXCLUDED.commands_offset),
	updated_at = now()`

// rows are the columns of a batch of task states, as upsertSQL's arrays.
type rows struct {
	ids                           []uuid.UUID
	partitions, priorities        []int32
	offsets                       []int64
	namespaces, actions, states   []string
	payloads, results, secrets    [][]byte
	outcomes, errs, codes, keys   []string
	timedOut                      []bool
	attempts, maxAttempts         []int32
	timeouts, initials, maxDelays []int64
	kinds, workers, origins       []string
	multipliers                   []float64
	traces                        []pgtype.Text
	created, runAt                []time.Time
	started, finished, updated    []pgtype.Timestamptz
	leases, completeBy            []pgtype.Timestamptz
}

// add appends one entry's task state.
func (r *rows) add(e Entry) {
	t := e.Task
	trace := pgtype.Text{}
	if len(t.TraceContext) > 0 {
		// A map of strings always encodes.
		b, _ := json.Marshal(t.TraceContext)
		trace = pgtype.Text{String: string(b), Valid: true}
	}
	payload := t.Payload
	if payload == nil {
		payload = []byte{}
	}
	var lease, completeBy time.Time
	switch t.Status {
	case store.Running:
		lease = t.LeaseUntil
	case store.Waiting:
		completeBy = t.CompleteBy
	}
	s := t.Settings
	r.ids = append(r.ids, t.ID)
	r.partitions = append(r.partitions, e.Partition)
	r.offsets = append(r.offsets, e.Offset)
	r.namespaces = append(r.namespaces, t.Namespace)
	r.actions = append(r.actions, t.Action)
	r.states = append(r.states, string(t.Status))
	r.priorities = append(r.priorities, t.Priority)
	r.payloads = append(r.payloads, payload)
	r.results = append(r.results, t.Result)
	r.outcomes = append(r.outcomes, t.Outcome)
	r.errs = append(r.errs, t.Error)
	r.timedOut = append(r.timedOut, t.TimedOut)
	r.codes = append(r.codes, t.ErrorCode)
	r.keys = append(r.keys, t.IdempotencyKey)
	r.attempts = append(r.attempts, t.Attempt)
	r.maxAttempts = append(r.maxAttempts, s.MaxAttempts)
	r.timeouts = append(r.timeouts, s.Timeout.Milliseconds())
	r.kinds = append(r.kinds, string(s.Backoff.Kind))
	r.initials = append(r.initials, s.Backoff.Initial.Milliseconds())
	r.maxDelays = append(r.maxDelays, s.Backoff.Max.Milliseconds())
	r.multipliers = append(r.multipliers, s.Backoff.Multiplier)
	r.workers = append(r.workers, t.WorkerID)
	r.traces = append(r.traces, trace)
	r.origins = append(r.origins, t.Origin)
	r.created = append(r.created, t.CreatedAt)
	r.runAt = append(r.runAt, t.RunAt)
	r.started = append(r.started, nullTime(t.StartedAt))
	r.finished = append(r.finished, nullTime(t.FinishedAt))
	r.updated = append(r.updated, nullTime(t.UpdatedAt))
	r.leases = append(r.leases, nullTime(lease))
	r.secrets = append(r.secrets, t.CompletionSecret)
	r.completeBy = append(r.completeBy, nullTime(completeBy))
}

// mark is how far a batch takes one partition.
type mark struct {
	partition int32
	// events is the next events offset to read once the batch is written;
	// commands the next commands offset the batch's states had consumed.
	events, commands int64
	// last is the highest events offset whose state the batch writes.
	last int64
}

// write upserts the rows and moves the partitions' offsets in one round trip,
// inside the caller's transaction, and returns how many rows it changed.
func write(ctx context.Context, tx pgx.Tx, r *rows, marks []mark) (int64, error) {
	parts, events, commands := make([]int32, len(marks)), make([]int64, len(marks)), make([]int64, len(marks))
	for i, m := range marks {
		parts[i], events[i], commands[i] = m.partition, m.events, m.commands
	}
	b := &pgx.Batch{}
	b.Queue(upsertSQL, r.ids, r.partitions, r.offsets, r.namespaces, r.actions, r.states, r.priorities, r.payloads, r.results,
		r.outcomes, r.errs, r.timedOut, r.codes, r.keys, r.attempts, r.maxAttempts, r.timeouts, r.kinds,
		r.initials, r.maxDelays, r.multipliers, r.workers, r.traces, r.origins, r.created, r.runAt,
		r.started, r.finished, r.updated, r.leases, r.secrets, r.completeBy)
	b.Queue(offsetsSQL, parts, events, commands)
	br := tx.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("write task view: %w", err)
	}
	return tag.RowsAffected(), nil
}

// nullTime is NULL for the zero time.
func nullTime(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}
