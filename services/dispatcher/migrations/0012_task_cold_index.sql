-- +goose Up
-- A partition owner reads its cold tasks (queued past its bound, kept only
-- here) back in hand-out order: the ready ones by priority, due time and
-- creation, the delayed ones by due time. Only rows that stay queued past
-- a view flush are in these, so tasks that start at once cost them
-- nothing.
CREATE INDEX tasks_cold_ready_idx ON tasks (partition, priority DESC, run_at, created_at, id) WHERE state = 'queued';
CREATE INDEX tasks_cold_due_idx ON tasks (partition, run_at, id) WHERE state = 'queued';

-- +goose Down
DROP INDEX tasks_cold_due_idx;
DROP INDEX tasks_cold_ready_idx;
