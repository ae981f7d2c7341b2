-- +goose Up
-- One row per workflow name: the switch that refuses new starts applies to
-- every version, and latest_version is what a start without a version runs
-- (the most recently created version, not the highest-sorting one).
CREATE TABLE workflows (
    namespace      text        NOT NULL,
    name           text        NOT NULL,
    enabled        boolean     NOT NULL DEFAULT true,
    latest_version text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, name)
);

-- Versions are immutable once created, so replicas cache their parsed form
-- forever. idempotency, start_target and steps are derived from the YAML and
-- kept for listings that should not parse every definition.
CREATE TABLE workflow_versions (
    namespace    text        NOT NULL,
    name         text        NOT NULL,
    version      text        NOT NULL,
    yaml         text        NOT NULL,
    idempotency  text        NOT NULL CHECK (idempotency IN ('none', 'optional', 'required')),
    start_target text        NOT NULL,
    steps        text[]      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, name, version),
    FOREIGN KEY (namespace, name) REFERENCES workflows (namespace, name)
);

-- A run's engine state (step, attempt, wait token, outputs, ...) lives in
-- state as JSON, written whole on every advance; the columns beside it are
-- what listings filter and show without decoding it. state is bytea, not
-- jsonb: jsonb refuses \u0000 in strings, which action results may hold, and
-- nothing queries inside it. input is the raw JSON the run was started with,
-- never rewritten.
CREATE TABLE runs (
    id              uuid        PRIMARY KEY,
    namespace       text        NOT NULL,
    workflow        text        NOT NULL,
    version         text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('pending', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'timed_out')),
    step            text        NOT NULL DEFAULT '',
    waiting_for     text        NOT NULL DEFAULT '',
    terminal        text        NOT NULL DEFAULT '',
    error           text        NOT NULL DEFAULT '',
    idempotency_key text        NOT NULL DEFAULT '',
    parent_run_id   uuid,
    -- How many ancestors the run has; bounds runaway child recursion.
    depth           integer     NOT NULL DEFAULT 0,
    input           bytea       NOT NULL,
    state           bytea       NOT NULL,
    -- The seq of the run's last history event.
    history_seq     integer     NOT NULL DEFAULT 0,
    -- The W3C trace context of the start; the run's invocations continue it.
    trace_context   jsonb,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    finished_at     timestamptz
);

-- Same key, same run: per workflow name, across its versions.
CREATE UNIQUE INDEX runs_idempotency_idx ON runs (namespace, workflow, idempotency_key) WHERE idempotency_key <> '';
-- Listings, newest first, with or without a workflow filter.
CREATE INDEX runs_list_idx ON runs (namespace, created_at DESC, id DESC);
CREATE INDEX runs_workflow_list_idx ON runs (namespace, workflow, created_at DESC, id DESC);
-- Cancel cascades to the children still going.
CREATE INDEX runs_parent_idx ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL AND finished_at IS NULL;

CREATE TABLE history (
    run_id  uuid        NOT NULL,
    seq     integer     NOT NULL,
    type    text        NOT NULL,
    step    text        NOT NULL DEFAULT '',
    detail  text        NOT NULL DEFAULT '',
    attempt integer     NOT NULL DEFAULT 0,
    at      timestamptz NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- Signals are kept with the run whether or not a step waits for them; a step
-- waiting for a type consumes the oldest unconsumed one.
CREATE TABLE signals (
    id          uuid        PRIMARY KEY,
    run_id      uuid        NOT NULL,
    type        text        NOT NULL,
    payload     bytea       NOT NULL,
    received_at timestamptz NOT NULL,
    consumed_at timestamptz
);
CREATE INDEX signals_run_idx ON signals (run_id, received_at) WHERE consumed_at IS NULL;

-- Durable timers (retry delays, poll delays, signal timeouts). A run's
-- advance replaces its timers; every replica fires due ones.
CREATE TABLE timers (
    run_id  uuid        NOT NULL,
    token   text        NOT NULL,
    kind    text        NOT NULL CHECK (kind IN ('retry', 'poll', 'signal')),
    fire_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, token)
);
CREATE INDEX timers_due_idx ON timers (fire_at);

-- +goose Down
DROP TABLE timers;
DROP TABLE signals;
DROP TABLE history;
DROP TABLE runs;
DROP TABLE workflow_versions;
DROP TABLE workflows;
