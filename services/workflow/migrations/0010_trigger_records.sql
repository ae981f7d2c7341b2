-- +goose Up
-- The stream records whose trigger started a run, one row per record,
-- written in the start's transaction: a record handed out again (after a
-- crash before its ack, after its message timeout, or regrouped into another
-- batch) finds its run here and starts no other. stream is NAMESPACE/STREAM.
CREATE TABLE trigger_records (
    namespace text NOT NULL,
    workflow  text NOT NULL,
    stream    text NOT NULL,
    record_id text NOT NULL,
    run_id    uuid NOT NULL,
    PRIMARY KEY (namespace, workflow, stream, record_id)
);

-- +goose Down
DROP TABLE trigger_records;
