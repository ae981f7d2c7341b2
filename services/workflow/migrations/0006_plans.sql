-- +goose Up
-- Plan executors' rate limits: fixed windows aligned to the UTC second,
-- minute and hour, shared by every replica. One row per executor holds its
-- three current windows, so a single upsert checks and counts all of them
-- under one row lock: an attempt is counted in every window or in none, and
-- concurrent replicas cannot both take the last slot. Every window is
-- counted whether or not the executor limits it, so a new version that adds
-- a limit starts from the true count.
CREATE TABLE plan_rates (
    namespace    text        NOT NULL,
    workflow     text        NOT NULL,
    plan         text        NOT NULL,
    executor     text        NOT NULL,
    second_start timestamptz NOT NULL,
    second_used  integer     NOT NULL,
    minute_start timestamptz NOT NULL,
    minute_used  integer     NOT NULL,
    hour_start   timestamptz NOT NULL,
    hour_used    integer     NOT NULL,
    PRIMARY KEY (namespace, workflow, plan, executor)
);

-- The sweep drops the rows of executors idle for over an hour.
CREATE INDEX plan_rates_hour_idx ON plan_rates (hour_start);

-- Plans' cached successful outputs, by rendered key, not by version.
-- invalidate_on is the plan's list when the entry was written: an
-- invalidation event removes the entries that listed it. output is bytea,
-- not jsonb, for the reason runs.state is.
CREATE TABLE plan_cache (
    namespace     text        NOT NULL,
    workflow      text        NOT NULL,
    plan          text        NOT NULL,
    key           text        NOT NULL,
    output        bytea       NOT NULL,
    expires_at    timestamptz NOT NULL,
    invalidate_on text[]      NOT NULL,
    written_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, workflow, plan, key)
);

CREATE INDEX plan_cache_expires_idx ON plan_cache (expires_at);
-- Invalidation by event, in a namespace, across its workflows and plans.
CREATE INDEX plan_cache_invalidate_idx ON plan_cache USING gin (invalidate_on);

-- +goose Down
DROP TABLE IF EXISTS plan_cache;
DROP TABLE IF EXISTS plan_rates;
