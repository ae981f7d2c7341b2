-- +goose Up
-- Every advance rewrites its run's row. Such an update is HOT (a heap-only
-- tuple: no index is touched) when no indexed column changes and the row's
-- page has room for the new version. Room comes from a lower fillfactor;
-- the parent index stops naming finished_at, which its predicate made an
-- indexed column, so the advance that ends a run is HOT too. The query for a
-- parent's running children still uses the index and checks finished_at in
-- the row.
ALTER TABLE runs SET (fillfactor = 60);
DROP INDEX runs_parent_idx;
CREATE INDEX runs_parent_idx ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

-- +goose Down
DROP INDEX runs_parent_idx;
CREATE INDEX runs_parent_idx ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL AND finished_at IS NULL;
ALTER TABLE runs RESET (fillfactor);
