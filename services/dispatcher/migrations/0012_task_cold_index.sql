-- +goose Up
-- A partition owner holds its queued tasks up to a bound; past it they are
-- cold, kept only here, and read back in hand-out order: the ready ones by
-- priority, due time and creation, the delayed ones by due time. A new
-- owner reads its running and waiting tasks and the first queued ones in
-- that order, not the whole backlog. Only rows that stay queued past a
-- view flush are in the queued indexes, so tasks that start at once cost
-- them nothing.
CREATE INDEX tasks_cold_ready_idx ON tasks (partition, priority DESC, run_at, created_at, id) WHERE state = 'queued';
CREATE INDEX tasks_cold_due_idx ON tasks (partition, run_at, id) WHERE state = 'queued';
CREATE INDEX tasks_busy_idx ON tasks (partition) WHERE state IN ('running', 'waiting');
DROP INDEX tasks_live_idx;

-- +goose Down
CREATE INDEX tasks_live_idx ON tasks (partition) WHERE state IN ('queued', 'running', 'waiting');
DROP INDEX tasks_busy_idx;
DROP INDEX tasks_cold_due_idx;
DROP INDEX tasks_cold_ready_idx;
