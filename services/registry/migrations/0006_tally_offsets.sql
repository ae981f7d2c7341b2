-- +goose Up
-- The tally counts each partition of flo.tasks.events exactly once by storing
-- the offset of its next record in the transaction that applies the counts,
-- instead of a processed_events row per event (and a pruning delete later).
CREATE TABLE IF NOT EXISTS tally_offsets (
    topic       text        NOT NULL,
    partition   int         NOT NULL,
    next_offset bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition)
);
DROP TABLE IF EXISTS processed_events;

-- +goose Down
CREATE TABLE IF NOT EXISTS processed_events (
    event_id     text        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS processed_events_processed_at_idx ON processed_events (processed_at);
DROP TABLE tally_offsets;
