package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// taskColumns are the columns scanTask reads: a task as the API shows it.
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
