package store

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/registry/migrations"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

const scaleWorkers = 10_000

// scaleDB is a migrated database holding 10,000 workers of namespace "big"
// (ids w00000..w09999, one process each; every tenth draining) heard from
// within the last minute but for every hundredth, silent for an hour, and a
// few of another namespace, with fresh statistics.
func scaleDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pg.Open(t.Context(), harness.NewDatabase(t), "registry", 4, migrations.FS, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for _, q := range []string{
		`INSERT INTO workers (namespace, worker_id, worker_type, status, max_concurrency, last_heartbeat)
		 SELECT 'big', 'w' || lpad(i::text, 5, '0'), 'action', CASE WHEN i % 10 = 0 THEN 'draining' ELSE 'idle' END, 10,
			now() - CASE WHEN i % 100 = 1 THEN interval '1 hour' ELSE (i % 60) * interval '1 second' END
		 FROM generate_series(0, $1 - 1) AS i`,
		`INSERT INTO worker_processes (namespace, worker_id, name, kind) SELECT namespace, worker_id, 'send', 'action' FROM workers`,
		`INSERT INTO workers (namespace, worker_id, worker_type, status, max_concurrency)
		 SELECT 'small', 'w' || i, 'action', 'active', 10 FROM generate_series(1, 5) AS i`,
		`ANALYZE workers, worker_processes`,
	} {
		var args []any
		if strings.Contains(q, "$1") {
			args = append(args, scaleWorkers)
		}
		_, err := pool.Exec(t.Context(), q, args...)
		require.NoError(t, err, q)
	}
	return pool
}

func explain(t *testing.T, db DB, sql string, args ...any) string {
	t.Helper()
	rows, err := db.Query(t.Context(), "EXPLAIN "+sql, args...)
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	return strings.Join(plan, "\n")
}

// TestAtScale checks, on a namespace of 10,000 workers, that the health
// sweep is one statement on the partial index of due workers, that a batch
// of heartbeats reads and writes its workers by primary key, and that
// listing pages through the namespace by primary key ranges, every worker
// once, in byte order.
func TestAtScale(t *testing.T) {
	t.Parallel()
	pool := scaleDB(t)
	ctx := t.Context()

	// Nobody due, as between silences: one index probe, nothing else read.
	plan := explain(t, pool, "(ANALYZE) "+markUnhealthySQL, (2 * time.Hour).Microseconds(), 1000)
	require.Contains(t, plan, "Index Scan using workers_heartbeat_due_idx", plan)
	require.NotContains(t, plan, "Seq Scan", plan)
	// Some due: they are found through the same index.
	plan = explain(t, pool, markUnhealthySQL, (30 * time.Minute).Microseconds(), 1000)
	require.Contains(t, plan, "workers_heartbeat_due_idx", plan)
	changes, err := MarkUnhealthy(ctx, pool, 30*time.Minute, 1000)
	require.NoError(t, err)
	require.Equal(t, scaleWorkers/100, len(changes))
	for _, c := range changes {
		require.Equal(t, Change{Namespace: "big", WorkerID: c.WorkerID, From: Idle, To: Unhealthy}, c)
		require.True(t, strings.HasSuffix(c.WorkerID, "01"), c.WorkerID)
	}

	// A page deep into the namespace reads its workers as a range of the
	// primary key (how it joins their processes is the planner's choice).
	plan = explain(t, pool, selectSQL(listPage), "big", "w05000", 100)
	require.Contains(t, plan, "Index Scan using workers_pkey", plan)
	require.Contains(t, plan, "worker_id > 'w05000'", plan)
	require.NotContains(t, plan, "Seq Scan on workers ", plan)

	// A gateway's batch of 80 heartbeats finds its workers, to read and to
	// write, through the primary key.
	nss, ids, loads, loadFractions := make([]string, 80), make([]string, 80), make([]int32, 80), make([]float64, 80)
	for i := range ids {
		nss[i], ids[i] = "big", fmt.Sprintf("w%05d", 4000+i)
	}
	// The plan for these 80 and the generic plan a prepared statement may
	// come to use, made for arrays of any length.
	args := []any{nss, ids, loads, loadFractions, loadFractions, (45 * time.Second).Microseconds()}
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, q := range []string{"SET plan_cache_mode = force_generic_plan", "PREPARE heartbeats AS " + heartbeatsSQL} {
		_, err := conn.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	for _, plan := range []string{
		explain(t, pool, heartbeatsSQL, args...),
		// EXECUTE takes no bound parameters: pgx writes them in.
		explain(t, conn, "EXECUTE heartbeats($1, $2, $3, $4, $5, $6)", append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...),
	} {
		require.Contains(t, plan, "Index Scan using workers_pkey", plan)
		require.NotContains(t, plan, "Seq Scan on workers ", plan)
	}
	_, err = conn.Exec(ctx, "DEALLOCATE heartbeats; RESET plan_cache_mode")
	require.NoError(t, err)

	var (
		after string
		seen  int
	)
	for pages := 1; ; pages++ {
		ws, err := ListWorkers(ctx, pool, "big", after, 1000)
		require.NoError(t, err)
		if len(ws) == 0 {
			break
		}
		require.LessOrEqual(t, pages, scaleWorkers/1000)
		for _, w := range ws {
			require.Equal(t, fmt.Sprintf("w%05d", seen), w.ID)
			require.Equal(t, []string{"send"}, []string{w.Processes[0].Name})
			seen++
		}
		after = ws[len(ws)-1].ID
	}
	require.Equal(t, scaleWorkers, seen)
}
