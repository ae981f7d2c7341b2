package store_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
	"github.com/razorbill/flo/services/workflow/migrations"
)

var payment = engine.PlanRef{Namespace: "ns", Workflow: "wf", Plan: "payment"}

// base is half a second before an hour ends.
var base = time.Date(2026, 11, 24, 14, 59, 59, 500_000_000, time.UTC)

// take takes a slot on the pool, outside any caller transaction.
func take(t *testing.T, pool *pgxpool.Pool, lim definition.RateLimit, now time.Time) (bool, time.Time, string) {
	t.Helper()
	ok, retryAt, detail, err := store.TakeRate(t.Context(), pool, payment, "stripe", &lim, now)
	require.NoError(t, err)
	return ok, retryAt, detail
}

func TestTakeRateCountsInEveryWindowOrNone(t *testing.T) {
	t.Parallel()
	pool := connect(t)
	lim := definition.RateLimit{PerSecond: 10, PerMinute: 2}
	now := base.Add(-10 * time.Second) // 14:59:49.5
	ok, _, _ := take(t, pool, lim, now)
	require.True(t, ok)
	ok, _, _ = take(t, pool, lim, now.Add(100*time.Millisecond))
	require.True(t, ok)

	// A new second has room, the minute does not: nothing is counted.
	ok, retryAt, detail := take(t, pool, lim, now.Add(time.Second))
	require.False(t, ok)
	require.Equal(t, time.Date(2026, 11, 24, 15, 0, 0, 0, time.UTC), retryAt)
	require.Equal(t, "max_per_minute 2 used up", detail)
	var secondStart time.Time
	var secondUsed, hourUsed int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT second_start, second_used, hour_used FROM plan_rates`).Scan(&secondStart, &secondUsed, &hourUsed))
	require.Equal(t, now.Truncate(time.Second), secondStart.UTC(), "the refused attempt must not open a new second window")
	require.Equal(t, 2, secondUsed)
	require.Equal(t, 2, hourUsed)

	// The next minute (and hour) counts from one again.
	ok, _, _ = take(t, pool, lim, now.Add(time.Second))
	require.False(t, ok)
	ok, _, _ = take(t, pool, lim, retryAt)
	require.True(t, ok)
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT second_used, hour_used FROM plan_rates`).Scan(&secondUsed, &hourUsed))
	require.Equal(t, 1, secondUsed)
	require.Equal(t, 1, hourUsed)
}

func TestTakeRateRetryAtIsTheLongestFullWindow(t *testing.T) {
	t.Parallel()
	pool := connect(t)
	now := base.Add(-30*time.Minute - 10*time.Second) // 14:29:49.5
	perSecond := definition.RateLimit{PerSecond: 1}

	ok, _, _ := take(t, pool, perSecond, now)
	require.True(t, ok)
	ok, retryAt, detail := take(t, pool, perSecond, now)
	require.False(t, ok)
	require.Equal(t, now.Truncate(time.Second).Add(time.Second), retryAt)
	require.Equal(t, "max_per_second 1 used up", detail)

	// Second and hour both full: the hour lasts longer.
	ok, retryAt, detail = take(t, pool, definition.RateLimit{PerSecond: 1, PerHour: 1}, now)
	require.False(t, ok)
	require.Equal(t, time.Date(2026, 11, 24, 15, 0, 0, 0, time.UTC), retryAt)
	require.Equal(t, "max_per_hour 1 used up", detail)

	// The first attempt counted in the minute although nothing limited
	// it, so a version that adds a minute limit starts from the truth.
	perMinute := definition.RateLimit{PerMinute: 2}
	ok, _, _ = take(t, pool, perMinute, now.Add(time.Second))
	require.True(t, ok)
	ok, retryAt, detail = take(t, pool, perMinute, now.Add(time.Second))
	require.False(t, ok)
	require.Equal(t, time.Date(2026, 11, 24, 14, 30, 0, 0, time.UTC), retryAt)
	require.Equal(t, "max_per_minute 2 used up", detail)
}

// A taker whose now was read before another's, and commits after it (two
// replicas at a second's end), must not move the window back: that would
// restart the newer second's count and let it pass the limit.
func TestTakeRateNeverMovesAWindowBack(t *testing.T) {
	t.Parallel()
	pool := connect(t)
	now := base.Add(-20*time.Minute - 10*time.Second) // 14:39:49.5
	perSecond := definition.RateLimit{PerSecond: 1}

	ok, _, _ := take(t, pool, perSecond, now.Add(time.Second))
	require.True(t, ok)
	ok, retryAt, detail := take(t, pool, perSecond, now)
	require.False(t, ok, "a take for a second that has ended is refused")
	require.Equal(t, now.Truncate(time.Second).Add(time.Second), retryAt)
	require.Equal(t, "max_per_second 1: a later window has opened", detail)
	ok, _, detail = take(t, pool, perSecond, now.Add(time.Second))
	require.False(t, ok, "the newer second still holds its one attempt")
	require.Equal(t, "max_per_second 1 used up", detail)

	// Unlimited windows do not refuse a late taker; the stored ones stay.
	ok, _, _ = take(t, pool, definition.RateLimit{PerMinute: 10}, now)
	require.True(t, ok)
	var secondStart time.Time
	var secondUsed, minuteUsed int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT second_start, second_used, minute_used FROM plan_rates`).Scan(&secondStart, &secondUsed, &minuteUsed))
	require.Equal(t, now.Add(time.Second).Truncate(time.Second), secondStart.UTC())
	require.Equal(t, 1, secondUsed)
	require.Equal(t, 2, minuteUsed)
}

// Many replicas taking slots at once, each in its own transaction, get
// exactly the limit between them.
func TestTakeRateHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	const limit, takers = 5, 24
	pool, err := pg.Connect(t.Context(), harness.NewDatabase(t), "workflow", 8, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pg.Migrate(t.Context(), pool, "workflow", migrations.FS))

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		oks  int
		errs []error
	)
	start := make(chan struct{})
	for range takers {
		wg.Go(func() {
			<-start
			ok, err := takeInTx(t.Context(), pool, definition.RateLimit{PerSecond: limit}, base)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				oks++
			}
		})
	}
	close(start)
	wg.Wait()
	require.Empty(t, errs)
	require.Equal(t, limit, oks)
}

func takeInTx(ctx context.Context, pool *pgxpool.Pool, lim definition.RateLimit, now time.Time) (bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ok, _, _, err := store.TakeRate(ctx, tx, payment, "stripe", &lim, now)
	if err != nil {
		return false, err
	}
	return ok, tx.Commit(ctx)
}

// putCache commits cache writes through a commit batch, as the runner does.
func putCache(t *testing.T, pool *pgxpool.Pool, writes ...engine.CacheWrite) {
	t.Helper()
	tx, err := pg.BeginBatch(t.Context(), pool)
	require.NoError(t, err)
	defer tx.Close(t.Context())
	var w store.Writes
	w.PutCache(writes)
	require.NoError(t, w.Commit(t.Context(), tx))
}

func cached(t *testing.T, pool *pgxpool.Pool, ref engine.PlanRef, key string, now time.Time) string {
	t.Helper()
	out, ok, err := store.CachedOutput(t.Context(), pool, ref, key, now)
	require.NoError(t, err)
	if !ok {
		return ""
	}
	return string(out)
}

func TestPlanCachePutGetExpireUpsert(t *testing.T) {
	t.Parallel()
	pool := connect(t)
	expires := base.Add(time.Hour)
	putCache(t, pool,
		engine.CacheWrite{Ref: payment, Key: "charge:c1", Output: json.RawMessage(`{"id":"ch_1"}`), Expires: expires, InvalidateOn: []string{"payment.refunded"}},
		engine.CacheWrite{Ref: payment, Key: "charge:c2", Output: json.RawMessage(`{"id":"ch_2","nul":"\u0000"}`), Expires: expires},
		// Two writes to one entry in a batch: the later wins.
		engine.CacheWrite{Ref: payment, Key: "charge:c1", Output: json.RawMessage(`{"id":"ch_1b"}`), Expires: expires, InvalidateOn: []string{"payment.refunded"}},
	)
	require.Equal(t, `{"id":"ch_1b"}`, cached(t, pool, payment, "charge:c1", base))
	require.Equal(t, `{"id":"ch_2","nul":"\u0000"}`, cached(t, pool, payment, "charge:c2", base))
	require.Empty(t, cached(t, pool, payment, "charge:c3", base))
	require.Empty(t, cached(t, pool, engine.PlanRef{Namespace: "ns", Workflow: "other", Plan: "payment"}, "charge:c1", base))

	require.Empty(t, cached(t, pool, payment, "charge:c1", expires), "an entry is dead at its expiry")

	putCache(t, pool, engine.CacheWrite{Ref: payment, Key: "charge:empty", Expires: expires})
	out, ok, err := store.CachedOutput(t.Context(), pool, payment, "charge:empty", base)
	require.NoError(t, err)
	require.True(t, ok, "a success without output is cached")
	require.Empty(t, out)

	// A later write replaces the entry, expiry and all.
	putCache(t, pool, engine.CacheWrite{Ref: payment, Key: "charge:c1", Output: json.RawMessage(`{"id":"ch_1c"}`), Expires: expires.Add(time.Hour)})
	require.Equal(t, `{"id":"ch_1c"}`, cached(t, pool, payment, "charge:c1", expires))
}

func TestInvalidatePlanCache(t *testing.T) {
	t.Parallel()
	pool := connect(t)
	expires := base.Add(time.Hour)
	refund := []string{"payment.refunded", "customer.deleted"}
	other := engine.PlanRef{Namespace: "ns", Workflow: "shipping", Plan: "quote"}
	elsewhere := engine.PlanRef{Namespace: "other-ns", Workflow: "wf", Plan: "payment"}
	putCache(t, pool,
		engine.CacheWrite{Ref: payment, Key: "k1", Output: json.RawMessage(`1`), Expires: expires, InvalidateOn: refund},
		engine.CacheWrite{Ref: payment, Key: "k2", Output: json.RawMessage(`2`), Expires: expires, InvalidateOn: refund},
		engine.CacheWrite{Ref: other, Key: "k1", Output: json.RawMessage(`3`), Expires: expires, InvalidateOn: []string{"customer.deleted"}},
		engine.CacheWrite{Ref: other, Key: "k3", Output: json.RawMessage(`4`), Expires: expires},
		engine.CacheWrite{Ref: elsewhere, Key: "k1", Output: json.RawMessage(`5`), Expires: expires, InvalidateOn: refund},
	)

	n, err := store.InvalidatePlanCache(t.Context(), pool, "ns", "customer.deleted", "k1")
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "k1 of both plans of the namespace")
	require.Empty(t, cached(t, pool, payment, "k1", base))
	require.Empty(t, cached(t, pool, other, "k1", base))
	require.Equal(t, "2", cached(t, pool, payment, "k2", base))
	require.Equal(t, "5", cached(t, pool, elsewhere, "k1", base), "other namespaces are untouched")

	n, err = store.InvalidatePlanCache(t.Context(), pool, "ns", "payment.refunded", "")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Empty(t, cached(t, pool, payment, "k2", base))
	require.Equal(t, "4", cached(t, pool, other, "k3", base), "an entry that does not list the event stays")

	n, err = store.InvalidatePlanCache(t.Context(), pool, "ns", "payment.refunded", "")
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestSweepPlans(t *testing.T) {
	t.Parallel()
	pool := connect(t)
	putCache(t, pool,
		engine.CacheWrite{Ref: payment, Key: "old", Output: json.RawMessage(`1`), Expires: base},
		engine.CacheWrite{Ref: payment, Key: "live", Output: json.RawMessage(`2`), Expires: base.Add(time.Second)},
	)
	lim := &definition.RateLimit{PerSecond: 1}
	for _, at := range []struct {
		executor string
		now      time.Time
	}{{"idle", base.Add(-2*time.Hour - time.Second)}, {"recent", base.Add(-time.Hour)}} {
		ok, _, _, err := store.TakeRate(t.Context(), pool, payment, at.executor, lim, at.now)
		require.NoError(t, err)
		require.True(t, ok)
	}

	n, err := store.SweepPlans(t.Context(), pool, base)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the expired entry and the idle executor's windows")
	require.Equal(t, "2", cached(t, pool, payment, "live", base))
	require.Equal(t, 1, count(t, pool, "plan_cache"))
	var executor string
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT executor FROM plan_rates`).Scan(&executor))
	require.Equal(t, "recent", executor)
}
