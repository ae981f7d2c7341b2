package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/pg"
)

// ErrBadMetadata is returned when Postgres refuses the metadata as jsonb
// (for example a \u0000 escape, which encoding/json accepts).
var ErrBadMetadata = errors.New("metadata is not storable JSON")

// Registration is what RegisterWorker writes: a whole new record.
type Registration struct {
	Namespace      string
	ID             string
	Type           Type
	MaxConcurrency int32
	MachineID      string
	Metadata       string
	Processes      []Process
}

// Drain marks a worker draining and returns the change (From equals To when
// it was draining already); pg.ErrNotFound for an unknown worker.
func Drain(ctx context.Context, db DB, namespace, id string) (Change, error) {
	c := Change{Namespace: namespace, WorkerID: id}
	err := db.QueryRow(ctx, `
		UPDATE workers w
		SET status = 'draining', updated_at = CASE WHEN w.status = 'draining' THEN w.updated_at ELSE now() END
		FROM (SELECT status FROM workers WHERE namespace = $1 AND worker_id = $2 FOR UPDATE) prev
		WHERE w.namespace = $1 AND w.worker_id = $2
		RETURNING prev.status, w.status`, namespace, id).Scan(&c.From, &c.To)
	if err != nil {
		return Change{}, fmt.Errorf("drain %s/%s: %w", namespace, id, pg.MapError(err))
	}
	return c, nil
}

// DeleteWorker removes a worker and its processes and returns the status it
// had; pg.ErrNotFound when it was not registered.
func DeleteWorker(ctx context.Context, db DB, namespace, id string) (Status, error) {
	var s Status
	err := db.QueryRow(ctx, `DELETE FROM workers WHERE namespace = $1 AND worker_id = $2 RETURNING status`, namespace, id).Scan(&s)
	if err != nil {
		return "", fmt.Errorf("delete worker %s/%s: %w", namespace, id, pg.MapError(err))
	}
	return s, nil
}

// GetWorker reads one worker with its processes; pg.ErrNotFound when it is
// not registered.
func GetWorker(ctx context.Context, db DB, namespace, id string) (Worker, error) {
	ws, err := selectWorkers(ctx, db, `SELECT * FROM workers WHERE namespace = $1 AND worker_id = $2`, namespace, id)
	if err != nil {
		return Worker{}, fmt.Errorf("select worker %s/%s: %w", namespace, id, err)
	}
	if len(ws) == 0 {
		return Worker{}, fmt.Errorf("select worker %s/%s: %w", namespace, id, pg.ErrNotFound)
	}
	return ws[0], nil
}

// listPage is a page of a namespace's workers: a range of the primary key
// (whose worker_id is in byte order), so every page costs the same however
// far into the namespace it is. The limit counts workers, not the joined
// rows of their processes.
const listPage = `
	SELECT * FROM workers WHERE namespace = $1 AND worker_id COLLATE "C" > $2
	ORDER BY worker_id COLLATE "C" LIMIT $3`

// ListWorkers reads a page of the workers of namespace with their
// processes, the first limit whose id comes after after in byte order. of namespace with its processes, by id in
// byte order.
func ListWorkers(ctx context.Context, db DB, namespace, after string, limit int) ([]Worker, error) {
	ws, err := selectWorkers(ctx, db, listPage, namespace, after, limit)
	if err != nil {
		return nil, fmt.Errorf("select workers of %s: %w", namespace, err)
	}
	return ws, nil
}

// selectWorkers reads workers and their processes in one statement (one row
// per process), so a worker and its processes come from one snapshot. Byte
// order (COLLATE "C") keeps listings the same whatever the database locale,
// and matches the order PutWorkers returns processes in.
func selectWorkers(ctx context.Context, db DB, workers string, args ...any) ([]Worker, error) {
	rows, err := db.Query(ctx, selectSQL(workers), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Worker
	for rows.Next() {
		var (
			w           Worker
			name, kind  *string
			runs, fails *int64
			lastRun     *time.Time
		)
		dest := append(workerDest(&w), &name, &kind, &runs, &fails, &lastRun)
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if n := len(out); n == 0 || out[n-1].ID != w.ID {
			out = append(out, w)
		}
		if name == nil {
			continue
		}
		p := Process{Name: *name, Kind: Kind(*kind), RunCount: *runs, FailCount: *fails}
		if lastRun != nil {
			p.LastRunAt = *lastRun
		}
		last := &out[len(out)-1]
		last.Processes = append(last.Processes, p)
	}
	return out, rows.Err()
}

// selectSQL reads the workers the query workers selects with their
// processes.
func selectSQL(workers string) string {
	return `
		SELECT ` + workerColumns + `, p.name, p.kind, p.run_count, p.fail_count, p.last_run_at
		FROM (` + workers + `) w LEFT JOIN worker_processes p ON p.namespace = w.namespace AND p.worker_id = w.worker_id
		ORDER BY w.worker_id COLLATE "C", p.name COLLATE "C"`
}

// markUnhealthySQL takes the due workers from the partial index
// workers_heartbeat_due_idx, oldest heartbeat first, so a sweep that finds
// nobody due reads one index entry.
const markUnhealthySQL = `
	WITH due AS MATERIALIZED (
		SELECT namespace, worker_id, status FROM workers
		WHERE status IN ('active', 'idle') AND last_heartbeat < now() - $1::bigint * interval '1 microsecond'
		ORDER BY last_heartbeat
		LIMIT $2
		FOR UPDATE SKIP LOCKED
	)
	UPDATE workers w SET status = 'unhealthy', updated_at = now()
	FROM due
	WHERE w.namespace = due.namespace AND w.worker_id = due.worker_id
	RETURNING w.namespace, w.worker_id, due.status`

// MarkUnhealthy marks up to limit workers unhealthy whose last heartbeat is
// older than timeout, and returns the changes. Rows another transaction holds
// are skipped, so replicas running it at once never mark a worker twice, and
// the locked row is rechecked, so a heartbeat that committed first wins.
func MarkUnhealthy(ctx context.Context, db DB, timeout time.Duration, limit int) ([]Change, error) {
	rows, err := db.Query(ctx, markUnhealthySQL, timeout.Microseconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("mark workers unhealthy: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Change, error) {
		c := Change{To: Unhealthy}
		return c, r.Scan(&c.Namespace, &c.WorkerID, &c.From)
	})
	if err != nil {
		return nil, fmt.Errorf("mark workers unhealthy: %w", err)
	}
	return out, nil
}

const workerColumns = `w.namespace, w.worker_id, w.worker_type, w.status, w.max_concurrency, w.current_load,
	w.cpu_load, w.memory_load, w.machine_id, coalesce(w.metadata::text, ''), w.tasks_completed, w.tasks_failed,
	w.registered_at, w.last_heartbeat`

func workerDest(w *Worker) []any {
	return []any{&w.Namespace, &w.ID, &w.Type, &w.Status, &w.MaxConcurrency, &w.CurrentLoad,
		&w.CPULoad, &w.MemoryLoad, &w.MachineID, &w.Metadata, &w.TasksCompleted, &w.TasksFailed,
		&w.RegisteredAt, &w.LastHeartbeat}
}

func scanWorker(r pgx.Row) (Worker, error) {
	var w Worker
	err := r.Scan(workerDest(&w)...)
	return w, err
}
