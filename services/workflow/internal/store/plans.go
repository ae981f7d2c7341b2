package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
)

// takeRateSQL counts an attempt in the executor's three current windows if
// every limited one has room, else changes nothing. A window whose stored
// start is older than the current one has ended: it counts from 1 again. A
// window whose stored start is newer (a taker whose now was read before
// another's, committing after it, as at a second's end with two replicas)
// never moves back: a limited one refuses the attempt, which is tried again
// with a new now, and an unlimited one is left as it is. Moving it back
// would restart the newer window's count and let it pass its limit. The
// upsert evaluates its WHERE on the newest committed row under the row's
// lock, so concurrent takers see each other's counts.
const takeRateSQL = `
INSERT INTO plan_rates AS r (namespace, workflow, plan, executor,
	second_start, second_used, minute_start, minute_used, hour_start, hour_used)
VALUES ($1, $2, $3, $4, $5, 1, $6, 1, $7, 1)
ON CONFLICT (namespace, workflow, plan, executor) DO UPDATE SET
	second_used = CASE WHEN r.second_start = excluded.second_start THEN r.second_used + 1
		WHEN r.second_start < excluded.second_start THEN 1 ELSE r.second_used END,
	second_start = GREATEST(r.second_start, excluded.second_start),
	minute_used = CASE WHEN r.minute_start = excluded.minute_start THEN r.minute_used + 1
		WHEN r.minute_start < excluded.minute_start THEN 1 ELSE r.minute_used END,
	minute_start = GREATEST(r.minute_start, excluded.minute_start),
	hour_used = CASE WHEN r.hour_start = excluded.hour_start THEN r.hour_used + 1
		WHEN r.hour_start < excluded.hour_start THEN 1 ELSE r.hour_used END,
	hour_start = GREATEST(r.hour_start, excluded.hour_start)
WHERE ($8 = 0 OR r.second_start < excluded.second_start OR (r.second_start = excluded.second_start AND r.second_used < $8))
	AND ($9 = 0 OR r.minute_start < excluded.minute_start OR (r.minute_start = excluded.minute_start AND r.minute_used < $9))
	AND ($10 = 0 OR r.hour_start < excluded.hour_start OR (r.hour_start = excluded.hour_start AND r.hour_used < $10))
RETURNING true`

// rateWindow is one of the fixed windows of a rate limit.
type rateWindow struct {
	field string
	size  time.Duration
	max   int
	start time.Time
	used  int
}

// TakeRate takes one slot for an attempt on executor under every limit lim
// sets, in db (the runner passes its transaction), atomically: either every
// window has room and the attempt counts in all of them, or it counts in
// none. Windows are fixed and aligned to the UTC second, minute and hour of
// now. When a window is full, ok is false, retryAt is the end of the full
// window that lasts longest, and detail names its limit. When a limited
// window newer than now's has opened meanwhile, ok is false too, with the
// end of now's window (already past) as retryAt.
func TakeRate(ctx context.Context, db DB, ref engine.PlanRef, executor string, lim *definition.RateLimit, now time.Time) (ok bool, retryAt time.Time, detail string, err error) {
	now = now.UTC()
	windows := []rateWindow{
		{field: "max_per_second", size: time.Second, max: lim.PerSecond},
		{field: "max_per_minute", size: time.Minute, max: lim.PerMinute},
		{field: "max_per_hour", size: time.Hour, max: lim.PerHour},
	}
	for i := range windows {
		windows[i].start = now.Truncate(windows[i].size)
	}
	err = db.QueryRow(ctx, takeRateSQL, ref.Namespace, ref.Workflow, ref.Plan, executor,
		windows[0].start, windows[1].start, windows[2].start, lim.PerSecond, lim.PerMinute, lim.PerHour).Scan(&ok)
	switch {
	case err == nil:
		return true, time.Time{}, "", nil
	case !errors.Is(err, pgx.ErrNoRows):
		return false, time.Time{}, "", fmt.Errorf("take rate slot of executor %s of plan %s: %w", executor, ref.Plan, err)
	}
	// Refused: the statement holds the row's lock now, so this read sees
	// the counts it was refused on.
	var starts [3]time.Time
	if err := db.QueryRow(ctx, `
SELECT second_start, second_used, minute_start, minute_used, hour_start, hour_used FROM plan_rates
WHERE namespace = $1 AND workflow = $2 AND plan = $3 AND executor = $4`, ref.Namespace, ref.Workflow, ref.Plan, executor).Scan(
		&starts[0], &windows[0].used, &starts[1], &windows[1].used, &starts[2], &windows[2].used); err != nil {
		return false, time.Time{}, "", fmt.Errorf("read rate windows of executor %s of plan %s: %w", executor, ref.Plan, err)
	}
	for i, w := range windows {
		switch {
		case w.max > 0 && starts[i].Equal(w.start) && w.used >= w.max:
			retryAt, detail = w.start.Add(w.size), fmt.Sprintf("%s %d used up", w.field, w.max)
		case w.max > 0 && starts[i].After(w.start) && detail == "":
			// now was read before a newer window opened: try again with a
			// new now (a time already past waits a moment).
			retryAt, detail = w.start.Add(w.size), fmt.Sprintf("%s %d: a later window has opened", w.field, w.max)
		}
	}
	if detail == "" {
		return false, time.Time{}, "", fmt.Errorf("take rate slot of executor %s of plan %s: refused with no window full", executor, ref.Plan)
	}
	return false, retryAt, detail, nil
}

// CachedOutput returns the output cached under key, if the entry is live
// at now.
func CachedOutput(ctx context.Context, db DB, ref engine.PlanRef, key string, now time.Time) (json.RawMessage, bool, error) {
	var out []byte
	err := db.QueryRow(ctx, `
SELECT output FROM plan_cache WHERE namespace = $1 AND workflow = $2 AND plan = $3 AND key = $4 AND expires_at > $5`,
		ref.Namespace, ref.Workflow, ref.Plan, key, now).Scan(&out)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("read plan %s cache: %w", ref.Plan, err)
	}
	return out, true, nil
}

// PutCache queues the upserts of writes in one statement. Of two writes to
// one entry, the later wins.
func (w *Writes) PutCache(writes []engine.CacheWrite) {
	type entry struct {
		engine.PlanRef
		key string
	}
	last := make(map[entry]int, len(writes))
	for i, c := range writes {
		last[entry{c.Ref, c.Key}] = i
	}
	n := len(last)
	if n == 0 {
		return
	}
	namespaces, workflows, plans, keys := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	outputs, expires, invalidateOn := make([][]byte, 0, n), make([]time.Time, 0, n), make([]string, 0, n)
	for i, c := range writes {
		if last[entry{c.Ref, c.Key}] != i {
			continue
		}
		// Lists of different lengths do not make a text[][], so each
		// goes as a JSON array.
		events, _ := json.Marshal(append([]string{}, c.InvalidateOn...))
		namespaces, workflows, plans, keys = append(namespaces, c.Ref.Namespace), append(workflows, c.Ref.Workflow), append(plans, c.Ref.Plan), append(keys, c.Key)
		output := []byte(c.Output)
		if output == nil {
			output = []byte{} // a success without output is cached too
		}
		outputs, expires, invalidateOn = append(outputs, output), append(expires, c.Expires), append(invalidateOn, string(events))
	}
	w.queue(fmt.Sprintf("cache %d plan outputs", n), `
INSERT INTO plan_cache (namespace, workflow, plan, key, output, expires_at, invalidate_on)
SELECT u.namespace, u.workflow, u.plan, u.key, u.output, u.expires_at, ARRAY(SELECT jsonb_array_elements_text(u.events))
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::timestamptz[], $7::jsonb[])
	AS u(namespace, workflow, plan, key, output, expires_at, events)
ON CONFLICT (namespace, workflow, plan, key) DO UPDATE SET
	output = excluded.output, expires_at = excluded.expires_at, invalidate_on = excluded.invalidate_on, written_at = now()`,
		namespaces, workflows, plans, keys, outputs, expires, invalidateOn)
}

// InvalidatePlanCache deletes the entries of namespace whose invalidate_on
// lists event; when key is not empty, only those cached under key. It
// returns how many it deleted.
func InvalidatePlanCache(ctx context.Context, db DB, namespace, event, key string) (int64, error) {
	tag, err := db.Exec(ctx, `
DELETE FROM plan_cache WHERE namespace = $1 AND invalidate_on @> ARRAY[$2::text] AND ($3 = '' OR key = $3)`,
		namespace, event, key)
	if err != nil {
		return 0, fmt.Errorf("invalidate plan cache on %s: %w", event, err)
	}
	return tag.RowsAffected(), nil
}

// SweepPlans deletes the cache entries expired at now and the rate windows
// of executors whose hour window ended more than an hour ago (their other
// windows ended before it). It returns how many rows it deleted.
func SweepPlans(ctx context.Context, db DB, now time.Time) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `
WITH cache AS (DELETE FROM plan_cache WHERE expires_at <= $1 RETURNING 1),
rates AS (DELETE FROM plan_rates WHERE hour_start < $1 - interval '2 hours' RETURNING 1)
SELECT (SELECT count(*) FROM cache) + (SELECT count(*) FROM rates)`, now).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("sweep plan cache and rate windows: %w", err)
	}
	return n, nil
}
