-- +goose Up
-- A queue (an action) reads its own cold tasks back in hand-out order when
-- it runs low on ready tasks while other queues fill its partition, and
-- before it hands out a task that comes after them; a new owner counts the
-- cold tasks of each queue over the same index.
CREATE INDEX tasks_cold_queue_idx ON tasks (partition, namespace, action, priority DESC, run_at, created_at, id)
	WHERE state = 'queued';

-- +goose Down
DROP INDEX tasks_cold_queue_idx;
