-- +goose Up
-- tasks becomes a view of the task-events log, written in batches by each
-- partition owner's materializer: partition is the task's events (and
-- commands) partition, view_offset the events offset of the state a row
-- holds, so an older state never overwrites a newer one.
ALTER TABLE tasks ADD COLUMN partition int NOT NULL DEFAULT -1;
ALTER TABLE tasks ADD COLUMN view_offset bigint NOT NULL DEFAULT -1;
-- A new owner's rebuild: the live tasks of its partition.
CREATE INDEX tasks_live_idx ON tasks (partition) WHERE state IN ('queued', 'running', 'waiting');
-- Leases and async deadlines are kept by the partition owners, not swept.
DROP INDEX tasks_lease_idx;
DROP INDEX tasks_waiting_idx;

-- How far the view has read each events partition: the next events offset
-- to read, and the next commands offset the state written so far had
-- consumed. Written in the same transaction as the rows.
CREATE TABLE view_offsets (
	partition       int PRIMARY KEY,
	events_offset   bigint NOT NULL,
	commands_offset bigint NOT NULL,
	updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Which replica owns each partition (written on assignment), so a caller
-- can find the owner of a task.
CREATE TABLE partition_owners (
	partition  int PRIMARY KEY,
	replica    text NOT NULL,
	address    text NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE partition_owners;
DROP TABLE view_offsets;
CREATE INDEX tasks_waiting_idx ON tasks (complete_by) WHERE state = 'waiting';
CREATE INDEX tasks_lease_idx ON tasks (lease_until) WHERE state = 'running';
DROP INDEX tasks_live_idx;
ALTER TABLE tasks DROP COLUMN view_offset;
ALTER TABLE tasks DROP COLUMN partition;
