-- +goose Up
-- A run's search attributes, taken from its input when it starts and never
-- changed: one row per run and attribute, the value in the column of its
-- type. namespace and workflow are copied from the run so an attribute
-- lookup needs no join to narrow by them. str sorts by bytes (COLLATE "C"),
-- so < and > on strings mean the same on every database.
CREATE TABLE run_attributes (
    run_id    uuid             NOT NULL,
    namespace text             NOT NULL,
    workflow  text             NOT NULL,
    name      text             NOT NULL,
    str       text COLLATE "C",
    num       double precision,
    ts        timestamptz,
    PRIMARY KEY (run_id, name),
    CHECK (num_nonnulls(str, num, ts) = 1)
);
-- A query's comparison finds the runs holding a value by (namespace, name,
-- value): equality and ranges alike; run_id makes it an index-only scan.
CREATE INDEX run_attributes_str_idx ON run_attributes (namespace, name, str, run_id) WHERE str IS NOT NULL;
CREATE INDEX run_attributes_num_idx ON run_attributes (namespace, name, num, run_id) WHERE num IS NOT NULL;
CREATE INDEX run_attributes_ts_idx ON run_attributes (namespace, name, ts, run_id) WHERE ts IS NOT NULL;

-- The attributes each workflow version declares, written with the version:
-- queries are checked against them (an unknown name, a literal of the wrong
-- type) without parsing every version's YAML.
CREATE TABLE workflow_attributes (
    namespace text NOT NULL,
    workflow  text NOT NULL,
    version   text NOT NULL,
    name      text NOT NULL,
    type      text NOT NULL CHECK (type IN ('string', 'number', 'timestamp')),
    PRIMARY KEY (namespace, workflow, version, name),
    FOREIGN KEY (namespace, workflow, version) REFERENCES workflow_versions (namespace, name, version)
);

-- +goose Down
DROP TABLE workflow_attributes;
DROP TABLE run_attributes;
