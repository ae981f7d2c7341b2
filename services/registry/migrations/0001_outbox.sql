-- +goose Up
-- The transactional outbox, exactly libs/outbox.Migration (a test checks it).
CREATE TABLE IF NOT EXISTS outbox (
    id         bigserial   PRIMARY KEY,
    topic      text        NOT NULL,
    key        bytea,
    value      bytea,
    headers    jsonb       NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The consumer inbox of task event ids (dropped by 0006: offsets replace it).
CREATE TABLE IF NOT EXISTS processed_events (
    event_id     text        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS processed_events_processed_at_idx ON processed_events (processed_at);

-- +goose Down
DROP TABLE processed_events;
DROP TABLE outbox;
