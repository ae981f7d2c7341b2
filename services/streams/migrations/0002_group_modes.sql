-- +goose Up
-- How a group spreads its records over consumers (see internal/group). An
-- exclusive group is held by owner until owner_until, a lease each of its
-- reads renews in the read's transaction, so every replica sees the owner.
ALTER TABLE groups
    ADD COLUMN mode        text        NOT NULL DEFAULT 'shared'
        CHECK (mode IN ('shared', 'exclusive', 'key_shared')),
    ADD COLUMN owner       text        NOT NULL DEFAULT '',
    ADD COLUMN owner_until timestamptz NOT NULL DEFAULT 'epoch';

-- +goose Down
ALTER TABLE groups DROP COLUMN owner_until, DROP COLUMN owner, DROP COLUMN mode;
