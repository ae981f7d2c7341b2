package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// LockNamespace takes the transaction-scoped advisory lock that serialises
// registrations in one namespace, so counting its workers and adding one
// cannot interleave with another registration.
func LockNamespace(ctx context.Context, tx pgx.Tx, namespace string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('flo.registry.workers/' || $1, 0))`, namespace); err != nil {
		return fmt.Errorf("lock namespace %s: %w", namespace, err)
	}
	return nil
}

// Occupancy returns how many workers namespace has and the current status of
// worker id, with found=false when id is not registered.
func Occupancy(ctx context.Context, db DB, namespace, id string) (count int, current Status, found bool, err error) {
	var prev *string
	err = db.QueryRow(ctx, `
		SELECT count(*), max(status) FILTER (WHERE worker_id = $2)
		FROM workers WHERE namespace = $1`, namespace, id).Scan(&count, &prev)
	if err != nil {
		return 0, "", false, fmt.Errorf("count workers of %s: %w", namespace, err)
	}
	if prev == nil {
		return count, "", false, nil
	}
	return count, Status(*prev), true, nil
}

// PutWorker creates or replaces the record of r.ID: status active, load and
// counters zero, registered and heard from now, processes exactly r's.
func PutWorker(ctx context.Context, tx pgx.Tx, r Registration) (Worker, error) {
	w, err := scanWorker(tx.QueryRow(ctx, `
		INSERT INTO workers AS w (namespace, worker_id, worker_type, status, max_concurrency, machine_id, metadata)
		VALUES ($1, $2, $3, 'active', $4, $5, NULLIF($6, '')::jsonb)
		ON CONFLICT (namespace, worker_id) DO UPDATE SET
			worker_type = EXCLUDED.worker_type, status = 'active', max_concurrency = EXCLUDED.max_concurrency,
			current_load = 0, cpu_load = 0, memory_load = 0,
			machine_id = EXCLUDED.machine_id, metadata = EXCLUDED.metadata,
			tasks_completed = 0, tasks_failed = 0,
			registered_at = now(), last_heartbeat = now(), updated_at = now()
		RETURNING `+workerColumns,
		r.Namespace, r.ID, string(r.Type), r.MaxConcurrency, r.MachineID, r.Metadata))
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "22P02" || pgErr.Code == "22P05") {
			return Worker{}, fmt.Errorf("%w: %s", ErrBadMetadata, pgErr.Message)
		}
		return Worker{}, fmt.Errorf("upsert worker %s/%s: %w", r.Namespace, r.ID, err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM worker_processes WHERE namespace = $1 AND worker_id = $2`, r.Namespace, r.ID); err != nil {
		return Worker{}, fmt.Errorf("delete processes of %s/%s: %w", r.Namespace, r.ID, err)
	}
	if len(r.Processes) > 0 {
		names := make([]string, len(r.Processes))
		kinds := make([]string, len(r.Processes))
		for i, p := range r.Processes {
			names[i], kinds[i] = p.Name, string(p.Kind)
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO worker_processes (namespace, worker_id, name, kind)
			SELECT $1, $2, p.name, p.kind FROM unnest($3::text[], $4::text[]) AS p(name, kind)`,
			r.Namespace, r.ID, names, kinds)
		if err != nil {
			return Worker{}, fmt.Errorf("insert processes of %s/%s: %w", r.Namespace, r.ID, err)
		}
	}
	w.Processes = make([]Process, len(r.Processes))
	for i, p := range r.Processes {
		w.Processes[i] = Process{Name: p.Name, Kind: p.Kind}
	}
	slices.SortFunc(w.Processes, func(a, b Process) int { return strings.Compare(a.Name, b.Name) })
	return w, nil
}

// Beat is one heartbeat.
type Beat struct {
	Namespace   string
	ID          string
	CurrentLoad int32
	CPULoad     float64
	MemoryLoad  float64
}

// StatusEvent is the outbox row a heartbeat writes when it changes the
// worker's status. The status it changes from is only known inside the
// statement, so the caller encodes one value per possible previous status.
type StatusEvent struct {
	Topic   string
	Key     []byte
	Headers string
	// ByPrevious maps each status the worker may have had to the record
	// value announcing the change from it.
	ByPrevious map[Status][]byte
}

// Heartbeat records a heartbeat in one statement: load and last_heartbeat,
// status active or idle by load unless draining (sticky), and, when that
// changes the status, ev's row for the previous status in the outbox. The
// statement is its own transaction, so a heartbeat costs one round trip. It
// returns pg.ErrNotFound for an unknown worker.
func Heartbeat(ctx context.Context, db DB, b Beat, ev StatusEvent) (Change, error) {
	prevs := make([]string, 0, len(ev.ByPrevious))
	values := make([][]byte, 0, len(ev.ByPrevious))
	for s, v := range ev.ByPrevious {
		prevs, values = append(prevs, string(s)), append(values, v)
	}
	// prev locks the row before beat updates it (beat joins it), so both
	// see the same, latest version even when a drain or the health check
	// committed in between.
	c := Change{Namespace: b.Namespace, WorkerID: b.ID}
	err := db.QueryRow(ctx, `
		WITH prev AS MATERIALIZED (
			SELECT status FROM workers WHERE namespace = $1 AND worker_id = $2 FOR UPDATE
		), beat AS (
			UPDATE workers w
			SET current_load = $3::integer, cpu_load = $4, memory_load = $5,
				last_heartbeat = now(), updated_at = now(),
				status = CASE WHEN w.status = 'draining' THEN 'draining'
				              WHEN $3::integer > 0 THEN 'active' ELSE 'idle' END
			FROM prev
			WHERE w.namespace = $1 AND w.worker_id = $2
			RETURNING prev.status AS prev_status, w.status AS new_status
		), event AS (
			INSERT INTO outbox (topic, key, value, headers)
			SELECT ARRAY[$6::text], ARRAY[$7::bytea], ARRAY[e.value], jsonb_build_array($8::jsonb)
			FROM beat JOIN unnest($9::text[], $10::bytea[]) AS e(prev_status, value) ON e.prev_status = beat.prev_status
			WHERE beat.prev_status <> beat.new_status
		)
		SELECT prev_status, new_status FROM beat`,
		b.Namespace, b.ID, b.CurrentLoad, b.CPULoad, b.MemoryLoad,
		ev.Topic, ev.Key, ev.Headers, prevs, values).Scan(&c.From, &c.To)
	if err != nil {
		return Change{}, fmt.Errorf("heartbeat of %s/%s: %w", b.Namespace, b.ID, pg.MapError(err))
	}
	return c, nil
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
	ws, err := selectWorkers(ctx, db, `w.namespace = $1 AND w.worker_id = $2`, namespace, id)
	if err != nil {
		return Worker{}, fmt.Errorf("select worker %s/%s: %w", namespace, id, err)
	}
	if len(ws) == 0 {
		return Worker{}, fmt.Errorf("select worker %s/%s: %w", namespace, id, pg.ErrNotFound)
	}
	return ws[0], nil
}

// ListWorkers reads every worker of namespace with its processes, by id in
// byte order.
func ListWorkers(ctx context.Context, db DB, namespace, after string, limit int) ([]Worker, error) {
	// The limit counts workers, not the joined rows of their processes.
	ws, err := selectWorkers(ctx, db, `w.namespace = $1 AND w.worker_id IN (
		SELECT worker_id FROM workers WHERE namespace = $1 AND worker_id COLLATE "C" > $2
		ORDER BY worker_id COLLATE "C" LIMIT $3)`, namespace, after, limit)
	if err != nil {
		return nil, fmt.Errorf("select workers of %s: %w", namespace, err)
	}
	return ws, nil
}

// selectWorkers reads workers and their processes in one statement (one row
// per process), so a worker and its processes come from one snapshot. Byte
// order (COLLATE "C") keeps listings the same whatever the database locale,
// and matches the order PutWorker returns processes in.
func selectWorkers(ctx context.Context, db DB, where string, args ...any) ([]Worker, error) {
	rows, err := db.Query(ctx, `
		SELECT `+workerColumns+`, p.name, p.kind, p.run_count, p.fail_count, p.last_run_at
		FROM workers w LEFT JOIN worker_processes p ON p.namespace = w.namespace AND p.worker_id = w.worker_id
		WHERE `+where+`
		ORDER BY w.worker_id COLLATE "C", p.name COLLATE "C"`, args...)
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

// MarkUnhealthy marks up to limit workers unhealthy whose last heartbeat is
// older than timeout, and returns the changes. Rows another transaction holds
// are skipped, so replicas running it at once never mark a worker twice, and
// the locked row is rechecked, so a heartbeat that committed first wins.
func MarkUnhealthy(ctx context.Context, db DB, timeout time.Duration, limit int) ([]Change, error) {
	rows, err := db.Query(ctx, `
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
		RETURNING w.namespace, w.worker_id, due.status`, timeout.Microseconds(), limit)
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
