package store

import (
	"context"
	"fmt"
	"time"

	"github.com/razorbill/flo/services/workflow/internal/engine"
)

// InsertSignal stores a signal with its run.
func InsertSignal(ctx context.Context, db DB, runID string, s engine.Signal) error {
	payload := []byte(s.Payload)
	if payload == nil {
		payload = []byte{}
	}
	if _, err := db.Exec(ctx, `INSERT INTO signals (id, run_id, type, payload, received_at) VALUES ($1, $2, $3, $4, $5)`,
		s.ID, runID, s.Type, payload, s.ReceivedAt); err != nil {
		return fmt.Errorf("store signal for run %s: %w", runID, err)
	}
	return nil
}

// PendingSignals reads the unconsumed signals of runs, oldest first per run.
func PendingSignals(ctx context.Context, db DB, runIDs []string) (map[string][]engine.Signal, error) {
	out := map[string][]engine.Signal{}
	if len(runIDs) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, `
SELECT run_id::text, id::text, type, payload, received_at FROM signals
WHERE run_id = ANY($1::uuid[]) AND consumed_at IS NULL
ORDER BY run_id, received_at, id`, runIDs)
	if err != nil {
		return nil, fmt.Errorf("read pending signals: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			runID   string
			s       engine.Signal
			payload []byte
		)
		if err := rows.Scan(&runID, &s.ID, &s.Type, &payload, &s.ReceivedAt); err != nil {
			return nil, fmt.Errorf("read pending signals: %w", err)
		}
		s.Payload = payload
		out[runID] = append(out[runID], s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read pending signals: %w", err)
	}
	return out, nil
}

// ConsumeSignals marks signals used up.
func ConsumeSignals(ctx context.Context, db DB, ids []string, at time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := db.Exec(ctx, `UPDATE signals SET consumed_at = $2 WHERE id = ANY($1::uuid[]) AND consumed_at IS NULL`, ids, at); err != nil {
		return fmt.Errorf("consume %d signals: %w", len(ids), err)
	}
	return nil
}
