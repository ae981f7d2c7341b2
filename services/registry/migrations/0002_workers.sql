-- +goose Up
CREATE TABLE workers (
    namespace       text             NOT NULL,
    worker_id       text             NOT NULL,
    worker_type     text             NOT NULL CHECK (worker_type IN ('action', 'stream')),
    status          text             NOT NULL CHECK (status IN ('active', 'idle', 'draining', 'unhealthy')),
    max_concurrency integer          NOT NULL CHECK (max_concurrency > 0),
    current_load    integer          NOT NULL DEFAULT 0,
    cpu_load        double precision NOT NULL DEFAULT 0,
    memory_load     double precision NOT NULL DEFAULT 0,
    machine_id      text             NOT NULL DEFAULT '',
    metadata        jsonb,
    tasks_completed bigint           NOT NULL DEFAULT 0,
    tasks_failed    bigint           NOT NULL DEFAULT 0,
    registered_at   timestamptz      NOT NULL DEFAULT now(),
    last_heartbeat  timestamptz      NOT NULL DEFAULT now(),
    updated_at      timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, worker_id)
);

-- The health check scans only workers that can still turn unhealthy, oldest
-- heartbeat first.
CREATE INDEX workers_heartbeat_due_idx ON workers (last_heartbeat) WHERE status IN ('active', 'idle');

CREATE TABLE worker_processes (
    namespace   text        NOT NULL,
    worker_id   text        NOT NULL,
    name        text        NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('action', 'stream_consumer')),
    run_count   bigint      NOT NULL DEFAULT 0,
    fail_count  bigint      NOT NULL DEFAULT 0,
    last_run_at timestamptz,
    PRIMARY KEY (namespace, worker_id, name),
    FOREIGN KEY (namespace, worker_id) REFERENCES workers (namespace, worker_id) ON DELETE CASCADE
);

-- +goose Down
DROP TABLE worker_processes;
DROP TABLE workers;
