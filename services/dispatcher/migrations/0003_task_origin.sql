-- +goose Up
-- origin says who invoked a task (the workflow service sets it); every event of
-- the task carries it, and events of tasks with an origin carry the result.
ALTER TABLE tasks ADD COLUMN origin text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE tasks DROP COLUMN origin;
