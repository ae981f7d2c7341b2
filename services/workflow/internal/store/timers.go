package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Timer is a row of timers.
type Timer struct {
	RunID  string
	Token  string
	Kind   string
	FireAt time.Time
}

// ReplaceTimers drops every timer of the runs in clear, then inserts set.
// Callers hold the lock of every run involved, so timer rows are only ever
// locked after their run's row and no transaction waits the other way round.
func (w *Writes) ReplaceTimers(clear []string, set []Timer) {
	if len(clear) > 0 {
		w.queue(fmt.Sprintf("clear timers of %d runs", len(clear)), `DELETE FROM timers WHERE run_id = ANY($1::text[]::uuid[])`, clear)
	}
	if len(set) == 0 {
		return
	}
	n := len(set)
	ids, tokens, kinds, at := make([]string, n), make([]string, n), make([]string, n), make([]time.Time, n)
	for i, t := range set {
		ids[i], tokens[i], kinds[i], at[i] = t.RunID, t.Token, t.Kind, t.FireAt
	}
	w.queue(fmt.Sprintf("set %d timers", n), `
INSERT INTO timers (run_id, token, kind, fire_at)
SELECT * FROM unnest($1::text[]::uuid[], $2::text[], $3::text[], $4::timestamptz[])
ON CONFLICT (run_id, token) DO UPDATE SET kind = excluded.kind, fire_at = excluded.fire_at`,
		ids, tokens, kinds, at)
}

// DueTimers lists up to limit timers due at now, earliest first, without
// locking them: the caller locks their runs and then takes the timers with
// TakeTimers.
func DueTimers(ctx context.Context, db DB, now time.Time, limit int) ([]Timer, error) {
	rows, err := db.Query(ctx, `
SELECT run_id::text, token, kind, fire_at FROM timers WHERE fire_at <= $1 ORDER BY fire_at LIMIT $2`, now, limit)
	if err != nil {
		return nil, fmt.Errorf("find due timers: %w", err)
	}
	timers, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Timer])
	if err != nil {
		return nil, fmt.Errorf("find due timers: %w", err)
	}
	return timers, nil
}

// TakeTimers deletes the given timers and returns those that still existed:
// another replica may have fired some in between.
func TakeTimers(ctx context.Context, db DB, timers []Timer) ([]Timer, error) {
	if len(timers) == 0 {
		return nil, nil
	}
	ids, tokens := make([]string, len(timers)), make([]string, len(timers))
	for i, t := range timers {
		ids[i], tokens[i] = t.RunID, t.Token
	}
	rows, err := db.Query(ctx, `
DELETE FROM timers WHERE (run_id, token) IN (SELECT * FROM unnest($1::text[]::uuid[], $2::text[]))
RETURNING run_id::text, token, kind, fire_at`, ids, tokens)
	if err != nil {
		return nil, fmt.Errorf("take %d timers: %w", len(timers), err)
	}
	taken, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Timer])
	if err != nil {
		return nil, fmt.Errorf("take %d timers: %w", len(timers), err)
	}
	return taken, nil
}

// NextTimer returns when the earliest timer falls due; ok is false when there
// is none.
func NextTimer(ctx context.Context, db DB) (at time.Time, ok bool, err error) {
	var t pgtype.Timestamptz
	if err := db.QueryRow(ctx, `SELECT min(fire_at) FROM timers`).Scan(&t); err != nil {
		return time.Time{}, false, fmt.Errorf("find next timer: %w", err)
	}
	return t.Time, t.Valid, nil
}

// NotifyTimers tells every replica's timer loop to look again once the
// transaction commits.
func (w *Writes) NotifyTimers() {
	w.queue("notify timers", `SELECT pg_notify($1, '')`, TimersChannel)
}
