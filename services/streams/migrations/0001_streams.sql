-- +goose Up
-- A stream's records live in the log topic flo.stream.<id>; the id is never
-- reused, so a stream deleted and created again never sees old records.
CREATE TABLE streams (
    id              bigserial   PRIMARY KEY,
    namespace       text        NOT NULL,
    name            text        NOT NULL,
    partitions      integer     NOT NULL CHECK (partitions BETWEEN 1 AND 256),
    retention_ms    bigint      NOT NULL CHECK (retention_ms >= 0),
    retention_bytes bigint      NOT NULL CHECK (retention_bytes >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (namespace, name)
);

CREATE TABLE groups (
    id             bigserial   PRIMARY KEY,
    stream_id      bigint      NOT NULL REFERENCES streams (id) ON DELETE CASCADE,
    name           text        NOT NULL,
    max_deliveries integer     NOT NULL CHECK (max_deliveries > 0),
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream_id, name)
);

-- next_offset is the first offset of the partition never handed to the group.
CREATE TABLE cursors (
    group_id    bigint  NOT NULL REFERENCES groups (id) ON DELETE CASCADE,
    partition   integer NOT NULL,
    next_offset bigint  NOT NULL,
    PRIMARY KEY (group_id, partition)
);

-- One row per range of offsets handed out together (see internal/pending).
-- Ranges of a group and partition never overlap.
CREATE TABLE pending (
    id           bigserial   PRIMARY KEY,
    group_id     bigint      NOT NULL REFERENCES groups (id) ON DELETE CASCADE,
    partition    integer     NOT NULL,
    first_offset bigint      NOT NULL,
    last_offset  bigint      NOT NULL CHECK (last_offset >= first_offset),
    settled      bytea       NOT NULL,
    stamps       bytea       NOT NULL,
    first_ms     bigint      NOT NULL,
    unsettled    integer     NOT NULL CHECK (unsettled > 0),
    consumer     text        NOT NULL,
    deliveries   integer     NOT NULL,
    delivered_at timestamptz NOT NULL,
    redeliver_at timestamptz NOT NULL,
    last_error   text        NOT NULL DEFAULT ''
);
-- Finding the range that holds an offset: the last one starting at or before it.
CREATE INDEX pending_offset_idx ON pending (group_id, partition, first_offset);
CREATE INDEX pending_due_idx ON pending (group_id, redeliver_at);

-- Topics of deleted streams, deleted from the broker after the stream's row
-- (and retried until the broker confirms).
CREATE TABLE dropped_topics (
    topic      text        PRIMARY KEY,
    dropped_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE dropped_topics;
DROP TABLE pending;
DROP TABLE cursors;
DROP TABLE groups;
DROP TABLE streams;
