// Package inbox makes log consumers idempotent: a consumer claims the event
// ids of the records it received in the same transaction as the state change
// they cause, and applies only the ids that were fresh. A redelivered record
// is then claimed already and changes nothing.
package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Migration is the SQL a service puts in one of its own migrations to create
// its processed_events table (unqualified, so it lands in the schema the
// migration runs in). The processed_at index lets old ids be pruned.
const Migration = `CREATE TABLE IF NOT EXISTS processed_events (
    event_id     text        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS processed_events_processed_at_idx ON processed_events (processed_at);
`

// Claim records eventIDs as processed in tx and returns those not seen
// before. A consumer applies only the fresh ones, in the same transaction, so
// the claim and the change commit or roll back together. Duplicate ids in
// eventIDs count once. A concurrent transaction claiming the same id makes
// Claim wait for it; the id is fresh here only if that one rolled back.
func Claim(ctx context.Context, tx pgx.Tx, eventIDs []string) (fresh map[string]bool, err error) {
	fresh = make(map[string]bool, len(eventIDs))
	if len(eventIDs) == 0 {
		return fresh, nil
	}
	rows, err := tx.Query(ctx, `
		INSERT INTO processed_events (event_id)
		SELECT DISTINCT id FROM unnest($1::text[]) AS u(id) ORDER BY id
		ON CONFLICT (event_id) DO NOTHING
		RETURNING event_id`, eventIDs)
	if err != nil {
		return nil, fmt.Errorf("claim %d events: %w", len(eventIDs), err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("claim events: scan: %w", err)
		}
		fresh[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim %d events: %w", len(eventIDs), err)
	}
	return fresh, nil
}
