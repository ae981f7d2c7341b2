package store

import (
	"context"
	"crypto/subtle"
	"fmt"

	"github.com/google/uuid"

	"github.com/razorbill/flo/libs/pg"
)

// Finish is the result a completion token brings to a waiting task.
type Finish struct {
	ID        uuid.UUID
	Namespace string
	Attempt   int32
	Secret    []byte
	// Failed ends the task failed with Error and ErrorCode; otherwise it
	// completes with Result and Outcome.
	Failed    bool
	Result    []byte
	Outcome   string
	Error     string
	ErrorCode string
}

// WaitingState is what a token's task is, for telling a caller why its
// completion changed nothing.
type WaitingState struct {
	Status  Status
	Attempt int32
	// SecretMatches says the token's secret is the one drawn for the
	// task's latest attempt.
	SecretMatches bool
}

// FinishWaiting ends the attempt f names, when its secret matches, and
// returns the change; pg.ErrNotFound when no such attempt is waiting or
// running. A running one is finished too: a webhook may beat its handler's
// pending answer, which then matches nothing.
func FinishWaiting(ctx context.Context, db DB, f Finish) (Change, error) {
	state, result := string(Completed), f.Result
	if f.Failed {
		state = string(Failed)
	}
	if result == nil {
		result = []byte{}
	}
	var c Change
	err := db.QueryRow(ctx, `
UPDATE tasks t SET state = $5, result = CASE WHEN $5 = 'completed' THEN $6::bytea END, outcome = $7, error = $8, error_code = $9,
	timed_out = false, complete_by = NULL, lease_until = NULL, finished_at = now(), updated_at = now()
WHERE t.id = $1 AND t.namespace = $2 AND t.attempt = $3 AND t.completion_secret = $4 AND t.state IN ('running', 'waiting')
RETURNING `+changeColumns, f.ID, f.Namespace, f.Attempt, f.Secret, state, result, f.Outcome, f.Error, f.ErrorCode).Scan(changeDest(&c)...)
	if err != nil {
		return Change{}, fmt.Errorf("finish waiting task %s: %w", f.ID, pg.MapError(err))
	}
	return c, nil
}

// GetWaitingState reads what the task of a token is; pg.ErrNotFound when
// the namespace has no such task.
func GetWaitingState(ctx context.Context, db DB, namespace string, id uuid.UUID, secret []byte) (WaitingState, error) {
	var (
		w      WaitingState
		stored []byte
	)
	err := db.QueryRow(ctx, `SELECT state, attempt, completion_secret FROM tasks WHERE id = $1 AND namespace = $2`, id, namespace).
		Scan(&w.Status, &w.Attempt, &stored)
	if err != nil {
		return WaitingState{}, fmt.Errorf("select task %s: %w", id, pg.MapError(err))
	}
	w.SecretMatches = len(stored) > 0 && subtle.ConstantTimeCompare(stored, secret) == 1
	return w, nil
}

// ExpireWaiting fails, as timed out, up to limit waiting tasks whose
// deadline has passed. SKIP LOCKED lets every replica run it at once.
func ExpireWaiting(ctx context.Context, db DB, limit int) ([]Change, error) {
	rows, err := db.Query(ctx, `
WITH expired AS (
	SELECT id FROM tasks
	WHERE state = 'waiting' AND complete_by < now()
	ORDER BY complete_by
	LIMIT $1
	FOR UPDATE SKIP LOCKED
)
UPDATE tasks t SET
	state = 'failed',
	error = 'no result by the async deadline',
	timed_out = true,
	error_code = '',
	complete_by = NULL,
	finished_at = now(),
	updated_at = now()
FROM expired WHERE t.id = expired.id
RETURNING `+changeColumns, limit)
	if err != nil {
		return nil, fmt.Errorf("expire waiting tasks: %w", err)
	}
	out, err := collectChanges(rows)
	if err != nil {
		return nil, fmt.Errorf("expire waiting tasks: %w", err)
	}
	return out, nil
}
