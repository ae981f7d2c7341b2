-- +goose Up
-- The partition count the view's rows are keyed by (tasks.partition,
-- view_offsets): a replica refuses to run on task topics of another count,
-- which `dispatcher repartition` changes together with this row.
CREATE TABLE view_layout (
	one        boolean PRIMARY KEY DEFAULT true CHECK (one),
	partitions int NOT NULL CHECK (partitions > 0),
	updated_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE view_layout;
