-- +goose Up
-- A task whose handler answered that its result comes later waits, without a
-- lease, until CompleteTask or FailTask finishes it by its completion token or
-- complete_by passes. completion_secret is drawn at each claim; the token is
-- the task id, the attempt and this secret, so it cannot be guessed from the
-- id and names one attempt.
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
	CHECK (state IN ('queued', 'running', 'waiting', 'completed', 'failed', 'dead_lettered'));
ALTER TABLE tasks ADD COLUMN completion_secret bytea;
ALTER TABLE tasks ADD COLUMN complete_by timestamptz;
-- The async deadline sweep.
CREATE INDEX tasks_waiting_idx ON tasks (complete_by) WHERE state = 'waiting';

-- +goose Down
DROP INDEX tasks_waiting_idx;
ALTER TABLE tasks DROP COLUMN complete_by;
ALTER TABLE tasks DROP COLUMN completion_secret;
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
	CHECK (state IN ('queued', 'running', 'completed', 'failed', 'dead_lettered'));
