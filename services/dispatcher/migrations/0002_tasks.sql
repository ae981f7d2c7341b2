-- +goose Up
CREATE TABLE namespaces (
	name       text PRIMARY KEY,
	created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE actions (
	namespace          text NOT NULL REFERENCES namespaces (name),
	name               text NOT NULL,
	timeout_ms         bigint NOT NULL,
	max_attempts       integer NOT NULL,
	backoff_kind       text NOT NULL,
	backoff_initial_ms bigint NOT NULL,
	backoff_max_ms     bigint NOT NULL,
	backoff_multiplier double precision NOT NULL,
	enabled            boolean NOT NULL DEFAULT true,
	created_at         timestamptz NOT NULL DEFAULT now(),
	updated_at         timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (namespace, name)
);

-- Settings are copied from the action onto every task so a task keeps the
-- policy it was invoked with. No foreign key to actions: inserts are the hot
-- path and actions are never deleted.
CREATE TABLE tasks (
	id                 uuid PRIMARY KEY,
	namespace          text NOT NULL,
	action             text NOT NULL,
	state              text NOT NULL CHECK (state IN ('queued', 'running', 'completed', 'failed', 'dead_lettered')),
	priority           integer NOT NULL DEFAULT 0,
	payload            bytea NOT NULL,
	result             bytea,
	outcome            text NOT NULL DEFAULT '',
	error              text NOT NULL DEFAULT '',
	idempotency_key    text NOT NULL DEFAULT '',
	attempt            integer NOT NULL DEFAULT 0,
	max_attempts       integer NOT NULL,
	timeout_ms         bigint NOT NULL,
	backoff_kind       text NOT NULL,
	backoff_initial_ms bigint NOT NULL,
	backoff_max_ms     bigint NOT NULL,
	backoff_multiplier double precision NOT NULL,
	worker_id          text NOT NULL DEFAULT '',
	trace_context      jsonb,
	lease_until        timestamptz,
	created_at         timestamptz NOT NULL,
	run_at             timestamptz NOT NULL,
	started_at         timestamptz,
	finished_at        timestamptz,
	updated_at         timestamptz NOT NULL DEFAULT now()
);

-- The claim scan: one queue's ready tasks in hand-out order.
CREATE INDEX tasks_queued_idx ON tasks (namespace, action, priority DESC, run_at, created_at) WHERE state = 'queued';
-- The lease reaper's scan.
CREATE INDEX tasks_lease_idx ON tasks (lease_until) WHERE state = 'running';
-- Dead-letter listing, newest first.
CREATE INDEX tasks_dead_letters_idx ON tasks (namespace, action, updated_at DESC) WHERE state = 'dead_lettered';

-- +goose Down
DROP TABLE tasks;
DROP TABLE actions;
DROP TABLE namespaces;
