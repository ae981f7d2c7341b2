-- +goose Up
-- timed_out says the latest attempt ran out of time (its handler passed its
-- deadline, or its lease expired); events carry it, so a workflow step sees a
-- task that timed out as the timeout outcome.
ALTER TABLE tasks ADD COLUMN timed_out boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE tasks DROP COLUMN timed_out;
