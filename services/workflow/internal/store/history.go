package store

import (
	"context"
	"fmt"
	"time"

	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/workflow/internal/engine"
)

// HistoryRow is one event of a run's history.
type HistoryRow struct {
	RunID string
	Seq   int
	engine.HistoryEvent
}

// AppendHistory inserts history events.
func (w *Writes) AppendHistory(rows []HistoryRow) {
	if len(rows) == 0 {
		return
	}
	n := len(rows)
	var (
		ids      = make([]string, n)
		seqs     = make([]int32, n)
		types    = make([]string, n)
		steps    = make([]string, n)
		details  = make([]string, n)
		attempts = make([]int32, n)
		ats      = make([]time.Time, n)
	)
	for i, r := range rows {
		ids[i], seqs[i], types[i], steps[i] = r.RunID, int32(r.Seq), r.Type, text.Clean(r.Step, text.MaxFreeBytes)
		details[i], attempts[i], ats[i] = text.Clean(r.Detail, text.MaxFreeBytes), int32(r.Attempt), r.At
	}
	w.queue(fmt.Sprintf("append %d history events", n), `
INSERT INTO history (run_id, seq, type, step, detail, attempt, at)
SELECT * FROM unnest($1::text[]::uuid[], $2::int[], $3::text[], $4::text[], $5::text[], $6::int[], $7::timestamptz[])`,
		ids, seqs, types, steps, details, attempts, ats)
}

// History reads a run's history in order.
func History(ctx context.Context, db DB, runID string) ([]HistoryRow, error) {
	rows, err := db.Query(ctx, `SELECT seq, type, step, detail, attempt, at FROM history WHERE run_id = $1 ORDER BY seq`, runID)
	if err != nil {
		return nil, fmt.Errorf("read history of run %s: %w", runID, err)
	}
	defer rows.Close()
	var out []HistoryRow
	for rows.Next() {
		h := HistoryRow{RunID: runID}
		if err := rows.Scan(&h.Seq, &h.Type, &h.Step, &h.Detail, &h.Attempt, &h.At); err != nil {
			return nil, fmt.Errorf("read history of run %s: %w", runID, err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read history of run %s: %w", runID, err)
	}
	return out, nil
}
