// Package outbox implements the transactional outbox: a service writes the
// records a state change emits into its own `outbox` table in the same
// transaction as the change, and a Relay publishes committed rows to the log
// and deletes them. A crash between commit and publish loses nothing; it can
// only publish a row twice, which idempotent consumers absorb.
package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/kafka"
)

// Migration is the SQL a service puts in one of its own migrations to create
// its outbox table. Names are unqualified so the table lands in the schema
// the migration runs in (pg.Migrate sets search_path to it).
const Migration = `CREATE TABLE IF NOT EXISTS outbox (
    id         bigserial   PRIMARY KEY,
    topic      text        NOT NULL,
    key        bytea,
    value      bytea,
    headers    jsonb       NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);
`

// copyThreshold is the record count above which Write uses COPY, which beats
// a single INSERT once there are more than a handful of rows.
const copyThreshold = 8

// Record is one log record waiting to be published.
type Record struct {
	Topic   string
	Key     []byte
	Value   []byte
	Headers map[string]string
}

// Write inserts records into the outbox in the caller's transaction, in
// order. A record with nil Headers gets the trace context of ctx, so the
// trace continues from the state change to the consumers.
func Write(ctx context.Context, tx pgx.Tx, records ...Record) error {
	if len(records) == 0 {
		return nil
	}
	if len(records) > copyThreshold {
		headers, err := encodeHeaders(ctx, records)
		if err != nil {
			return err
		}
		rows := make([][]any, len(records))
		for i, r := range records {
			rows[i] = []any{r.Topic, r.Key, r.Value, headers[i]}
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"outbox"}, []string{"topic", "key", "value", "headers"}, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("write outbox: copy %d records: %w", len(records), err)
		}
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
	return `
		INSERT INTO outbox (topic, key, value, headers)
		SELECT t, k, v, h::jsonb
		FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::text[]) WITH ORDINALITY AS r(t, k, v, h, n)
		ORDER BY n`, []any{topics, keys, values, headers}, nil
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
