-- +goose Up
-- Plan steps wait on two more kinds of timer: 'plan' (an executor's retry
-- delay, or room under its rate limits) and 'task' (the timeout_ms of an
-- async executor's attempt).
ALTER TABLE timers DROP CONSTRAINT timers_kind_check;
ALTER TABLE timers ADD CONSTRAINT timers_kind_check CHECK (kind IN ('retry', 'poll', 'signal', 'plan', 'task'));

-- +goose Down
DELETE FROM timers WHERE kind IN ('plan', 'task');
ALTER TABLE timers DROP CONSTRAINT timers_kind_check;
ALTER TABLE timers ADD CONSTRAINT timers_kind_check CHECK (kind IN ('retry', 'poll', 'signal'));
