-- +goose Up
-- error_code is the worker's code for the last failed attempt ("card_declined");
-- events carry it so a workflow can tell failures apart by code.
ALTER TABLE tasks ADD COLUMN error_code text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE tasks DROP COLUMN error_code;
