package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/query"
	"github.com/razorbill/flo/services/workflow/internal/store"
	"github.com/razorbill/flo/services/workflow/migrations"
)

// declaredOrders is what the runs insertRuns makes declare.
var declaredOrders = query.Declared{
	"customer_id":  {definition.AttributeString},
	"order_amount": {definition.AttributeNumber},
	"created_at":   {definition.AttributeTimestamp},
}

// insertRuns inserts n runs of workflow orders in namespace ns, in
// transactions of 1,000 as the runner writes them: run i has customer
// c-(i mod 1000), amount i and a timestamp i minutes after base.
func insertRuns(ctx context.Context, tb testing.TB, pool *pgxpool.Pool, ns string, n int, base time.Time) {
	tb.Helper()
	for start := 0; start < n; start += 1000 {
		var runs []*store.Run
		for i := start; i < min(start+1000, n); i++ {
			now := base.Add(time.Duration(i) * time.Millisecond)
			runs = append(runs, &store.Run{
				Run: engine.Run{
					ID: uuid.Must(uuid.NewV7()).String(), Namespace: ns, Workflow: "orders", Version: "1",
					Status: engine.StatusWaiting, Input: []byte(`{}`), CreatedAt: now, UpdatedAt: now,
				},
				Attributes: []definition.AttributeValue{
					{Name: "customer_id", Type: definition.AttributeString, Str: fmt.Sprintf("c-%d", i%1000)},
					{Name: "order_amount", Type: definition.AttributeNumber, Num: float64(i)},
					{Name: "created_at", Type: definition.AttributeTimestamp, Time: base.Add(time.Duration(i) * time.Minute)},
				},
			})
		}
		tx, err := pg.BeginBatch(ctx, pool)
		require.NoError(tb, err)
		var w store.Writes
		require.NoError(tb, w.InsertRuns(runs))
		require.NoError(tb, w.Commit(ctx, tx))
		tx.Close(ctx)
	}
	_, err := pool.Exec(ctx, `ANALYZE run_attributes; ANALYZE runs`)
	require.NoError(tb, err)
}

func where(tb testing.TB, src string) query.Expr {
	tb.Helper()
	e, err := query.Parse(src)
	require.NoError(tb, err)
	checked, err := query.Check(e, declaredOrders)
	require.NoError(tb, err)
	return checked
}

// TestListRunsWhereReadsAttributes: the attributes go in with the run and
// come back with it, and a query picks by each typed column.
func TestListRunsWhereReadsAttributes(t *testing.T) {
	ctx := t.Context()
	pool := connect(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	insertRuns(ctx, t, pool, "ns", 2500, base)
	insertRuns(ctx, t, pool, "other", 10, base)

	runs, err := store.ListRuns(ctx, pool, store.RunFilter{Namespace: "ns", Limit: 100, Where: where(t, `customer_id = "c-42"`)})
	require.NoError(t, err)
	require.Len(t, runs, 3, "runs 42, 1042 and 2042")
	for i, r := range runs {
		n := float64(2042 - 1000*i)
		require.Equal(t, []definition.AttributeValue{
			{Name: "created_at", Type: definition.AttributeTimestamp, Time: base.Add(time.Duration(n) * time.Minute)},
			{Name: "customer_id", Type: definition.AttributeString, Str: "c-42"},
			{Name: "order_amount", Type: definition.AttributeNumber, Num: n},
		}, r.Attributes, "newest first, attributes by name")
	}
	runs, err = store.ListRuns(ctx, pool, store.RunFilter{Namespace: "ns", Limit: 100, Where: where(t,
		`order_amount >= 2490 OR created_at < "2026-01-01T00:02:00Z"`)})
	require.NoError(t, err)
	require.Len(t, runs, 12)

	got, err := store.GetRun(ctx, pool, "other", runs[0].ID)
	require.Nil(t, got, "runs of another namespace stay there")
	require.Error(t, err)
}

// BenchmarkListRunsWhere measures an equality query on an indexed attribute
// over 10,000 runs with three attributes each (ten runs match). Run it once:
//
//	go test ./internal/store -run '^$' -bench ListRunsWhere -benchtime 200x
func BenchmarkListRunsWhere(b *testing.B) {
	ctx := context.Background()
	pool, err := pg.Connect(ctx, harness.NewDatabase(b), "workflow", 2, nil)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	require.NoError(b, pg.Migrate(ctx, pool, "workflow", migrations.FS))
	begin := time.Now()
	insertRuns(ctx, b, pool, "ns", 10000, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b.Logf("inserted 10,000 runs with 30,000 attributes in %s", time.Since(begin).Round(time.Millisecond))
	for _, src := range []string{`customer_id = "c-42"`, `order_amount > 9990`, `customer_id = "c-42" AND order_amount > 5000`} {
		f := store.RunFilter{Namespace: "ns", Limit: 101, Where: where(b, src)}
		b.Run(src, func(b *testing.B) {
			for b.Loop() {
				runs, err := store.ListRuns(ctx, pool, f)
				if err != nil {
					b.Fatal(err)
				}
				if len(runs) == 0 {
					b.Fatal("no runs")
				}
			}
		})
	}
}
