-- +goose Up
-- The owner's consumer group member id, so a replica can remove from the
-- group a peer that died without leaving it (nothing listens at its
-- address any more) instead of waiting out its session.
ALTER TABLE partition_owners ADD COLUMN member text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE partition_owners DROP COLUMN member;
