-- +goose Up
-- A signal carries its run's namespace, so the signals no step has taken yet
-- are counted per namespace (FLO_MAX_PENDING_SIGNALS_PER_NAMESPACE) from an
-- index of that namespace's alone.
ALTER TABLE signals ADD COLUMN namespace text NOT NULL DEFAULT '';
UPDATE signals s SET namespace = r.namespace FROM runs r WHERE r.id = s.run_id AND s.consumed_at IS NULL;
CREATE INDEX signals_namespace_pending_idx ON signals (namespace) WHERE consumed_at IS NULL;

-- +goose Down
DROP INDEX signals_namespace_pending_idx;
ALTER TABLE signals DROP COLUMN namespace;
