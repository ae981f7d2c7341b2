-- +goose Up
-- Workers are listed, and their rows locked, in byte order (COLLATE "C")
-- whatever the database's locale. With the key columns in that collation the
-- primary keys serve it: a page of a listing is an index range (keyset), not
-- a sort of the whole namespace, and every batch locks rows in one order.
ALTER TABLE worker_processes
    ALTER COLUMN namespace TYPE text COLLATE "C",
    ALTER COLUMN worker_id TYPE text COLLATE "C",
    ALTER COLUMN name      TYPE text COLLATE "C";
ALTER TABLE workers
    ALTER COLUMN namespace TYPE text COLLATE "C",
    ALTER COLUMN worker_id TYPE text COLLATE "C";

-- +goose Down
ALTER TABLE workers
    ALTER COLUMN namespace TYPE text COLLATE "default",
    ALTER COLUMN worker_id TYPE text COLLATE "default";
ALTER TABLE worker_processes
    ALTER COLUMN namespace TYPE text COLLATE "default",
    ALTER COLUMN worker_id TYPE text COLLATE "default",
    ALTER COLUMN name      TYPE text COLLATE "default";
