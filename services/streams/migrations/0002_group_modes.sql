-- +goose Up
-- How a group spreads its records over consumers (see internal/group). An
-- exclusive group is held by owner while it reads within its lease: owner_seen_at
-- is its last read, written in the read's transaction, so every replica sees it.
ALTER TABLE groups
    ADD COLUMN mode          text        NOT NULL DEFAULT 'shared'
        CHECK (mode IN ('shared', 'exclusive', 'key_shared')),
    ADD COLUMN owner         text        NOT NULL DEFAULT '',
    ADD COLUMN owner_seen_at timestamptz NOT NULL DEFAULT '-infinity';

-- +goose Down
ALTER TABLE groups DROP COLUMN owner_seen_at, DROP COLUMN owner, DROP COLUMN mode;
