package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/services/workflow/internal/engine"
)

// InsertSignal stores a signal with its run, of namespace.
func InsertSignal(ctx context.Context, db DB, namespace, runID string, s engine.Signal) error {
	payload := []byte(s.Payload)
	if payload == nil {
		payload = []byte{}
	}
	if _, err := db.Exec(ctx, `INSERT INTO signals (id, run_id, type, payload, received_at, namespace) VALUES ($1, $2, $3, $4, $5, $6)`,
		s.ID, runID, s.Type, payload, s.ReceivedAt, namespace); err != nil {
		return fmt.Errorf("store signal for run %s: %w", runID, err)
	}
	return nil
}

// CountPendingSignals counts the signals of namespace's runs that no step
// has taken yet. Those of ended runs are left out: no step will take them,
// and they would hold the namespace's room for good.
func CountPendingSignals(ctx context.Context, db DB, namespace string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `
SELECT count(*) FROM signals s JOIN runs r ON r.id = s.run_id
WHERE s.namespace = $1 AND s.consumed_at IS NULL AND r.status IN ('pending', 'running', 'waiting')`, namespace).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count pending signals in %s: %w", namespace, err)
	}
	return n, nil
}

// MaxPendingSignals is how many unconsumed signals a run may hold. Every
// advance loads them, so the runner refuses signals past it, and the load
// reads no more than this many oldest ones of a run in any case.
const MaxPendingSignals = 100

// pendingSignalsSQL reads the unconsumed signals of runs, oldest first per
// run (scanSignals), at most MaxPendingSignals per run.
var pendingSignalsSQL = fmt.Sprintf(`
SELECT run_id::text, id::text, type, payload, received_at FROM (
	SELECT run_id, id, type, payload, received_at,
		row_number() OVER (PARTITION BY run_id ORDER BY received_at, id) AS n
	FROM signals
	WHERE run_id = ANY($1::text[]::uuid[]) AND consumed_at IS NULL
) s
WHERE n <= %d
ORDER BY run_id, received_at, id`, MaxPendingSignals)

func scanSignals(rows pgx.Rows) (map[string][]engine.Signal, error) {
	defer rows.Close()
	out := map[string][]engine.Signal{}
	for rows.Next() {
		var (
			runID   string
			s       engine.Signal
			payload []byte
		)
		if err := rows.Scan(&runID, &s.ID, &s.Type, &payload, &s.ReceivedAt); err != nil {
			return nil, err
		}
		s.Payload = payload
		out[runID] = append(out[runID], s)
	}
	return out, rows.Err()
}

// ConsumeSignals marks signals used up.
func (w *Writes) ConsumeSignals(ids []string, at time.Time) {
	if len(ids) == 0 {
		return
	}
	w.queue(fmt.Sprintf("consume %d signals", len(ids)),
		`UPDATE signals SET consumed_at = $2 WHERE id = ANY($1::text[]::uuid[]) AND consumed_at IS NULL`, ids, at)
}
