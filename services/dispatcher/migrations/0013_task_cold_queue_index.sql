-- +goose Up
-- A queue that runs low on ready tasks while other queues fill its
-- partition reads its own cold tasks back, in hand-out order; a new owner
-- counts the cold tasks of each queue over the same index.
CREATE INDEX tasks_cold_queue_idx ON tasks (partition, namespace, action, priority DESC, run_at, created_at, id)
	WHERE state = 'queued';

-- +goose Down
DROP INDEX tasks_cold_queue_idx;
