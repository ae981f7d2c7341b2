-- +goose Up
-- Records the log refused for good, moved aside by the outbox relay so the
-- rows behind them move on; exactly libs/outbox.DeadMigration (a test checks
-- it). flo outbox dead list shows them.
CREATE TABLE IF NOT EXISTS outbox_dead (
    id         bigserial   PRIMARY KEY,
    outbox_id  bigint      NOT NULL,
    topic      text        NOT NULL,
    key        bytea,
    value      bytea,
    headers    jsonb       NOT NULL,
    error      text        NOT NULL,
    written_at timestamptz NOT NULL,
    dead_at    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
-- Exactly libs/outbox.DeadMigrationDown: it drops the dead records.
DROP TABLE IF EXISTS outbox_dead;
