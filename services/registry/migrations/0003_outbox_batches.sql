-- +goose Up
-- A row of the outbox per transaction, exactly libs/outbox.BatchMigration (a
-- test checks it).
ALTER TABLE outbox ALTER COLUMN headers DROP DEFAULT;
ALTER TABLE outbox
    ALTER COLUMN topic   TYPE text[]  USING ARRAY[topic],
    ALTER COLUMN key     TYPE bytea[] USING ARRAY[key],
    ALTER COLUMN value   TYPE bytea[] USING ARRAY[value],
    ALTER COLUMN headers TYPE jsonb   USING jsonb_build_array(headers);

-- +goose Down
-- Exactly libs/outbox.BatchMigrationDown.
CREATE TEMPORARY TABLE outbox_records ON COMMIT DROP AS
SELECT o.id, r.n, r.topic, r.key, r.value, o.headers -> (r.n::int - 1) AS headers, o.created_at
FROM outbox o, unnest(o.topic, o.key, o.value) WITH ORDINALITY AS r(topic, key, value, n);
DELETE FROM outbox;
ALTER TABLE outbox
    ALTER COLUMN topic   TYPE text  USING NULL,
    ALTER COLUMN key     TYPE bytea USING NULL,
    ALTER COLUMN value   TYPE bytea USING NULL,
    ALTER COLUMN headers TYPE jsonb USING NULL;
ALTER TABLE outbox ALTER COLUMN headers SET DEFAULT '{}';
INSERT INTO outbox (topic, key, value, headers, created_at)
SELECT topic, key, value, COALESCE(headers, '{}'), created_at FROM outbox_records ORDER BY id, n;
