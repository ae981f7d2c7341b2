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

-- +goose Down
DROP TABLE outbox;
