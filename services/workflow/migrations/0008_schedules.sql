-- +goose Up
-- One schedule per workflow name, owned by the version that wrote it: a new
-- version replaces it (or removes it, having none). next_fire_at is the
-- durable next tick; whichever replica locks a due row (FOR UPDATE SKIP
-- LOCKED) starts its run and moves next_fire_at in the same transaction, so
-- each tick starts one run however many replicas look. paused is the
-- definition's; enabled follows the workflow's switch (disable/enable).
CREATE TABLE schedules (
    namespace       text        NOT NULL,
    workflow        text        NOT NULL,
    version         text        NOT NULL,
    -- Exactly one of cron and interval_ms is set; timezone goes with cron.
    cron            text        NOT NULL DEFAULT '',
    timezone        text        NOT NULL DEFAULT '',
    interval_ms     bigint      NOT NULL DEFAULT 0,
    max_concurrent  integer     NOT NULL CHECK (max_concurrent >= 1),
    paused          boolean     NOT NULL,
    enabled         boolean     NOT NULL,
    next_fire_at    timestamptz NOT NULL,
    last_fire_at    timestamptz,
    last_run_id     uuid,
    fired           bigint      NOT NULL DEFAULT 0,
    skipped         bigint      NOT NULL DEFAULT 0,
    last_skipped_at timestamptz,
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (namespace, workflow),
    FOREIGN KEY (namespace, workflow) REFERENCES workflows (namespace, name)
);
CREATE INDEX schedules_due_idx ON schedules (next_fire_at) WHERE enabled AND NOT paused;

-- The runs schedules started that may still be going, for max_concurrent;
-- rows of ended runs are deleted when their schedule next fires.
CREATE TABLE schedule_runs (
    run_id    uuid        PRIMARY KEY,
    namespace text        NOT NULL,
    workflow  text        NOT NULL,
    tick      timestamptz NOT NULL
);
CREATE INDEX schedule_runs_workflow_idx ON schedule_runs (namespace, workflow);

-- +goose Down
DROP TABLE schedule_runs;
DROP TABLE schedules;
