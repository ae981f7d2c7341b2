// Package outbox implements the transactional outbox: a service writes the
// records a state change emits into its own `outbox` table in the same
// transaction as the change, and a Relay publishes committed rows to the log
// and deletes them. A crash between commit and publish loses nothing; it can
// only publish a row twice, which idempotent consumers absorb.
//
// One row holds every record one Write wrote, in order, as parallel arrays:
// a transaction that emits a hundred records costs Postgres one row to
// insert, index and delete, not a hundred.
//
// A record the log refuses for good (too large, invalid) cannot hold up the
// rows behind it: the relay moves it to the service's outbox_dead table,
// counts and logs it, and publishes the rest; ListDead and Requeue are what
// `flo outbox dead` runs on that table.
package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/kafka"
)

// Migration is the SQL a service puts in one of its own migrations to create
// its outbox table, followed by BatchMigration in a later one. Names are
// unqualified so the table lands in the schema the migration runs in
// (pg.Migrate sets search_path to it).
const Migration = `CREATE TABLE IF NOT EXISTS outbox (
    id         bigserial   PRIMARY KEY,
    topic      text        NOT NULL,
    key        bytea,
    value      bytea,
    headers    jsonb       NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);
`

// BatchMigration turns the outbox of Migration, a record per row, into the
// table the relay reads: a row per Write, its records' topics, keys, values
// and headers in arrays (headers a JSON array of objects). Rows already
// there become rows of one record.
const BatchMigration = `ALTER TABLE outbox ALTER COLUMN headers DROP DEFAULT;
ALTER TABLE outbox
    ALTER COLUMN topic   TYPE text[]  USING ARRAY[topic],
    ALTER COLUMN key     TYPE bytea[] USING ARRAY[key],
    ALTER COLUMN value   TYPE bytea[] USING ARRAY[value],
    ALTER COLUMN headers TYPE jsonb   USING jsonb_build_array(headers);
`

// BatchMigrationDown undoes BatchMigration, keeping every record, in order.
const BatchMigrationDown = `CREATE TEMPORARY TABLE outbox_records ON COMMIT DROP AS
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
`

// DeadMigration is the SQL a service puts in a migration after
// BatchMigration to create outbox_dead, where the relay moves a record the
// log refuses for good (too large, invalid), a row per record: its topic,
// key, value and headers as written, the outbox row it came from, when it
// was written, why it was refused and when.
const DeadMigration = `CREATE TABLE IF NOT EXISTS outbox_dead (
    id         bigserial   PRIMARY KEY,
    outbox_id  bigint      NOT NULL,
    topic      text        NOT NULL,
    key        bytea,
    value      bytea,
    headers    jsonb       NOT NULL,
    error      text        NOT NULL,
    written_at timestamptz NOT NULL,
    dead_at    timestamptz NOT NULL DEFAULT now()
);
`

// DeadMigrationDown undoes DeadMigration. It drops the records the table
// holds: list them first (flo outbox dead list).
const DeadMigrationDown = `DROP TABLE IF EXISTS outbox_dead;
`

// CheckMigrations reports whether a service's migrations fsys hold the
// outbox as the relay reads it: Migration in the file first, BatchMigration
// and BatchMigrationDown in the file batches, DeadMigration and
// DeadMigrationDown in the file dead. Services' tests call it.
func CheckMigrations(fsys fs.FS, first, batches, dead string) error {
	for _, m := range []struct {
		file string
		want []string
	}{
		{first, []string{Migration}},
		{batches, []string{BatchMigration, BatchMigrationDown}},
		{dead, []string{DeadMigration, DeadMigrationDown}},
	} {
		b, err := fs.ReadFile(fsys, m.file)
		if err != nil {
			return fmt.Errorf("outbox migrations: %w", err)
		}
		for _, sql := range m.want {
			if !strings.Contains(string(b), sql) {
				return fmt.Errorf("outbox migrations: %s does not hold the library's SQL:\n%s", m.file, sql)
			}
		}
	}
	return nil
}

// Record is one log record waiting to be published.
type Record struct {
	Topic   string
	Key     []byte
	Value   []byte
	Headers map[string]string
}

// Write inserts records into the outbox in the caller's transaction, in
// order, as one row. A record with nil Headers gets the trace context of
// ctx, so the trace continues from the state change to the consumers.
func Write(ctx context.Context, tx pgx.Tx, records ...Record) error {
	if len(records) == 0 {
		return nil
	}
	sql, args, err := Insert(ctx, records...)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("write outbox: insert %d records: %w", len(records), err)
	}
	return nil
}

// Insert returns the statement that inserts records into the outbox in
// order, as Write does, for a caller that sends it in its transaction with
// other statements (a pgx.Batch) to save the round trip of its own.
func Insert(ctx context.Context, records ...Record) (sql string, args []any, err error) {
	headers, err := encodeHeaders(ctx, records)
	if err != nil {
		return "", nil, err
	}
	topics := make([]string, len(records))
	keys := make([][]byte, len(records))
	values := make([][]byte, len(records))
	for i, r := range records {
		topics[i], keys[i], values[i] = r.Topic, r.Key, r.Value
	}
	return `INSERT INTO outbox (topic, key, value, headers) VALUES ($1, $2, $3, $4::jsonb)`,
		[]any{topics, keys, values, "[" + strings.Join(headers, ",") + "]"}, nil
}

// encodeHeaders checks records and encodes their headers as JSON.
func encodeHeaders(ctx context.Context, records []Record) ([]string, error) {
	var trace []byte
	headers := make([]string, len(records))
	for i, r := range records {
		// A row without a topic could never be published and would block
		// the relay behind it.
		if r.Topic == "" {
			return nil, fmt.Errorf("write outbox: record %d has no topic", i)
		}
		if r.Headers == nil {
			if trace == nil {
				var err error
				if trace, err = json.Marshal(kafka.TraceHeaders(ctx)); err != nil {
					return nil, fmt.Errorf("write outbox: encode headers: %w", err)
				}
			}
			headers[i] = string(trace)
			continue
		}
		h, err := json.Marshal(r.Headers)
		if err != nil {
			return nil, fmt.Errorf("write outbox: encode headers: %w", err)
		}
		headers[i] = string(h)
	}
	return headers, nil
}
