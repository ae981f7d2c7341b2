package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
)

// Sender sends several statements in one round trip; pgx.Tx and pg.BatchTx
// are Senders.
type Sender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Key names one worker.
type Key struct {
	Namespace string
	ID        string
}

func compareKeys(a, b Key) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.ID, b.ID))
}

// Occupancy is what a batch of registrations must know before it admits
// any: how many workers each of its namespaces has, and the status of each
// of its workers that is registered already.
type Occupancy struct {
	Counts   map[string]int
	Statuses map[Key]Status
}

// statusesSQL reads the status of the registered workers among the keys
// given as two parallel arrays.
const statusesSQL = `
	SELECT w.namespace, w.worker_id, w.status
	FROM workers w JOIN unnest($1::text[], $2::text[]) AS k(namespace, worker_id)
		ON w.namespace = k.namespace AND w.worker_id = k.worker_id`

// Occupy takes the transaction-scoped advisory locks that make the
// registrations of one namespace take turns (one per namespace, in name
// order, so two batches never wait for each other in a cycle), then reads
// the occupancy of namespaces and keys, all in one round trip. The reads are
// statements of their own, so their snapshot is taken once the locks are
// held and no other registration of those namespaces can overtake them.
func Occupy(ctx context.Context, tx Sender, namespaces []string, keys []Key) (Occupancy, error) {
	namespaces = slices.Clone(namespaces)
	slices.Sort(namespaces)
	namespaces = slices.Compact(namespaces)
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended('flo.registry.workers/' || ns, 0)) FROM unnest($1::text[]) AS ns`, namespaces)
	b.Queue(`SELECT ns, (SELECT count(*) FROM workers w WHERE w.namespace = ns) FROM unnest($1::text[]) AS ns`, namespaces)
	nss, ids := splitKeys(keys)
	b.Queue(statusesSQL, nss, ids)
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	if _, err := br.Exec(); err != nil {
		return Occupancy{}, fmt.Errorf("lock %d namespaces: %w", len(namespaces), err)
	}
	occ := Occupancy{Counts: make(map[string]int, len(namespaces))}
	rows, err := br.Query()
	if err == nil {
		var (
			ns string
			n  int
		)
		_, err = pgx.ForEachRow(rows, []any{&ns, &n}, func() error {
			occ.Counts[ns] = n
			return nil
		})
	}
	if err != nil {
		return Occupancy{}, fmt.Errorf("count workers of %d namespaces: %w", len(namespaces), err)
	}
	rows, err = br.Query()
	if err != nil {
		return Occupancy{}, fmt.Errorf("read %d workers: %w", len(keys), err)
	}
	if occ.Statuses, err = collectStatuses(rows); err != nil {
		return Occupancy{}, fmt.Errorf("read %d workers: %w", len(keys), err)
	}
	if err := br.Close(); err != nil {
		return Occupancy{}, fmt.Errorf("read occupancy: %w", err)
	}
	return occ, nil
}

// Statuses returns the status of each registered worker among keys.
func Statuses(ctx context.Context, db DB, keys []Key) (map[Key]Status, error) {
	nss, ids := splitKeys(keys)
	rows, err := db.Query(ctx, statusesSQL, nss, ids)
	if err != nil {
		return nil, fmt.Errorf("read %d workers: %w", len(keys), err)
	}
	out, err := collectStatuses(rows)
	if err != nil {
		return nil, fmt.Errorf("read %d workers: %w", len(keys), err)
	}
	return out, nil
}

func collectStatuses(rows pgx.Rows) (map[Key]Status, error) {
	out := map[Key]Status{}
	var (
		k Key
		s Status
	)
	_, err := pgx.ForEachRow(rows, []any{&k.Namespace, &k.ID, &s}, func() error {
		out[k] = s
		return nil
	})
	return out, err
}

func splitKeys(keys []Key) (namespaces, ids []string) {
	namespaces, ids = make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		namespaces[i], ids[i] = k.Namespace, k.ID
	}
	return namespaces, ids
}

// PutWorkers creates or replaces the records of regs, whose keys must be
// distinct, in one round trip: status active, load and counters zero,
// registered and heard from now, processes exactly the registration's
// (replaced[i] says regs[i] had a record whose processes go). It returns the
// records in the order of regs. Rows are written in key order, the order
// every other batch locks them in.
func PutWorkers(ctx context.Context, tx Sender, regs []Registration, replaced []bool) ([]Worker, error) {
	order := make([]int, len(regs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return compareKeys(regs[a].Key(), regs[b].Key()) })
	var (
		w                         workerArrays
		gone                      []Key
		pNS, pIDs, pNames, pKinds []string
	)
	for _, i := range order {
		r := regs[i]
		w.add(r)
		if replaced[i] {
			gone = append(gone, r.Key())
		}
		for _, p := range r.Processes {
			pNS, pIDs, pNames, pKinds = append(pNS, r.Namespace), append(pIDs, r.ID), append(pNames, p.Name), append(pKinds, string(p.Kind))
		}
	}
	b := &pgx.Batch{}
	b.Queue(`
		INSERT INTO workers AS w (namespace, worker_id, worker_type, status, max_concurrency, machine_id, metadata)
		SELECT r.namespace, r.worker_id, r.worker_type, 'active', r.max_concurrency, r.machine_id, NULLIF(r.metadata, '')::jsonb
		FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::text[], $6::text[])
			AS r(namespace, worker_id, worker_type, max_concurrency, machine_id, metadata)
		ORDER BY r.namespace COLLATE "C", r.worker_id COLLATE "C"
		ON CONFLICT (namespace, worker_id) DO UPDATE SET
			worker_type = EXCLUDED.worker_type, status = 'active', max_concurrency = EXCLUDED.max_concurrency,
			current_load = 0, cpu_load = 0, memory_load = 0,
			machine_id = EXCLUDED.machine_id, metadata = EXCLUDED.metadata,
			tasks_completed = 0, tasks_failed = 0,
			registered_at = now(), last_heartbeat = now(), updated_at = now()
		RETURNING `+workerColumns,
		w.namespaces, w.ids, w.types, w.concurrency, w.machines, w.metadata)
	if len(gone) > 0 {
		nss, ids := splitKeys(gone)
		b.Queue(`
			DELETE FROM worker_processes p USING unnest($1::text[], $2::text[]) AS k(namespace, worker_id)
			WHERE p.namespace = k.namespace AND p.worker_id = k.worker_id`, nss, ids)
	}
	if len(pNames) > 0 {
		b.Queue(`
			INSERT INTO worker_processes (namespace, worker_id, name, kind)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])`, pNS, pIDs, pNames, pKinds)
	}
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	rows, err := br.Query()
	byKey := make(map[Key]Worker, len(regs))
	if err == nil {
		var got Worker
		_, err = pgx.ForEachRow(rows, workerDest(&got), func() error {
			byKey[Key{got.Namespace, got.ID}] = got
			return nil
		})
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "22P02" || pgErr.Code == "22P05") {
			return nil, fmt.Errorf("%w: %s", ErrBadMetadata, pgErr.Message)
		}
		return nil, fmt.Errorf("upsert %d workers: %w", len(regs), err)
	}
	if len(gone) > 0 {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("delete processes of %d workers: %w", len(gone), err)
		}
	}
	if len(pNames) > 0 {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("insert %d processes: %w", len(pNames), err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("put %d workers: %w", len(regs), err)
	}
	out := make([]Worker, len(regs))
	for i, r := range regs {
		out[i] = byKey[r.Key()]
		out[i].Processes = make([]Process, len(r.Processes))
		for j, p := range r.Processes {
			out[i].Processes[j] = Process{Name: p.Name, Kind: p.Kind}
		}
		slices.SortFunc(out[i].Processes, func(a, b Process) int { return strings.Compare(a.Name, b.Name) })
	}
	return out, nil
}

// workerArrays are registrations as the parallel arrays of an unnest.
type workerArrays struct {
	namespaces, ids, types, machines, metadata []string
	concurrency                                []int32
}

func (a *workerArrays) add(r Registration) {
	a.namespaces, a.ids, a.types = append(a.namespaces, r.Namespace), append(a.ids, r.ID), append(a.types, string(r.Type))
	a.concurrency, a.machines, a.metadata = append(a.concurrency, r.MaxConcurrency), append(a.machines, r.MachineID), append(a.metadata, r.Metadata)
}

// Key is the key of the registered worker.
func (r Registration) Key() Key { return Key{r.Namespace, r.ID} }

// Key is the key of the changed worker.
func (c Change) Key() Key { return Key{c.Namespace, c.WorkerID} }

// Key is the key of the beating worker.
func (b Beat) Key() Key { return Key{b.Namespace, b.ID} }

// Beat is one heartbeat.
type Beat struct {
	Namespace   string
	ID          string
	CurrentLoad int32
	CPULoad     float64
	MemoryLoad  float64
}

// Heartbeats records beats, whose workers must be distinct, in one
// statement, and returns the change of each worker that exists (From equals
// To when the status stayed); beats of unknown workers are left out.
//
// A beat rewrites its worker's row (load, last_heartbeat, and status active
// or idle by load unless draining, which is sticky, so an unhealthy worker
// recovers) only when the row is due: its status or current_load would
// change, or its last_heartbeat is older than fresh. Any other beat writes
// nothing and takes no lock; it is answered with the status it read. Every
// row update is non-HOT (last_heartbeat is indexed by
// workers_heartbeat_due_idx), so skipping the beats of workers heard from
// lately is what keeps thousands of idle workers cheap. cpu_load and
// memory_load alone never make a row due: they drift on every beat and
// would otherwise force every write; they are written with the next write
// of the row, so they lag by at most fresh plus one heartbeat interval.
//
// The due rows are locked in key order, the order every other batch locks
// them in, before they are updated, so the previous status read is that of
// the version updated even when a drain or the health check committed in
// between. A skipped row is read without a lock; a drain committing after
// that read is simply later than the beat, which the worker learns from the
// drain's event and its next heartbeat.
func Heartbeats(ctx context.Context, db DB, beats []Beat, fresh time.Duration) ([]Change, error) {
	beats = slices.Clone(beats)
	slices.SortFunc(beats, func(a, b Beat) int { return compareKeys(a.Key(), b.Key()) })
	nss, ids := make([]string, len(beats)), make([]string, len(beats))
	loads := make([]int32, len(beats))
	cpus, mems := make([]float64, len(beats)), make([]float64, len(beats))
	for i, b := range beats {
		nss[i], ids[i], loads[i], cpus[i], mems[i] = b.Namespace, b.ID, b.CurrentLoad, b.CPULoad, b.MemoryLoad
	}
	rows, err := db.Query(ctx, heartbeatsSQL, nss, ids, loads, cpus, mems, fresh.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("heartbeats of %d workers: %w", len(beats), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Change, error) {
		var c Change
		return c, r.Scan(&c.Namespace, &c.WorkerID, &c.From, &c.To)
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeats of %d workers: %w", len(beats), err)
	}
	return out, nil
}

// heartbeatsSQL: cur reads the beating workers without locking them and
// says which are due; prev locks the due ones in key order; up writes them.
// The answer is up's rows and, for the others, the status cur read. cur and
// prev look each worker up by primary key (LATERAL ... LIMIT 1, FOR
// UPDATE: subqueries the planner cannot turn into a hash join over every
// worker of the table), prev going through the due keys in key order.
const heartbeatsSQL = `
	WITH b AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::integer[], $4::double precision[], $5::double precision[])
			AS b(namespace, worker_id, current_load, cpu_load, memory_load)
	), cur AS MATERIALIZED (
		SELECT w.namespace, w.worker_id, w.status,
			w.status <> CASE WHEN w.status = 'draining' THEN 'draining'
			                 WHEN b.current_load > 0 THEN 'active' ELSE 'idle' END
			OR w.current_load <> b.current_load
			OR w.last_heartbeat < now() - $6::bigint * interval '1 microsecond' AS due
		FROM b CROSS JOIN LATERAL (
			SELECT w.namespace, w.worker_id, w.status, w.current_load, w.last_heartbeat FROM workers w
			WHERE w.namespace = b.namespace AND w.worker_id = b.worker_id
			LIMIT 1
		) w
	), prev AS MATERIALIZED (
		SELECT w.namespace, w.worker_id, w.status
		FROM (SELECT namespace, worker_id FROM cur WHERE due ORDER BY namespace, worker_id) d
		CROSS JOIN LATERAL (
			SELECT w.namespace, w.worker_id, w.status FROM workers w
			WHERE w.namespace = d.namespace AND w.worker_id = d.worker_id
			FOR UPDATE
		) w
	), up AS (
		UPDATE workers w
		SET current_load = b.current_load, cpu_load = b.cpu_load, memory_load = b.memory_load,
			last_heartbeat = now(), updated_at = now(),
			status = CASE WHEN w.status = 'draining' THEN 'draining'
			              WHEN b.current_load > 0 THEN 'active' ELSE 'idle' END
		FROM b JOIN prev ON prev.namespace = b.namespace AND prev.worker_id = b.worker_id
		WHERE w.namespace = b.namespace AND w.worker_id = b.worker_id
		RETURNING w.namespace, w.worker_id, prev.status AS was, w.status
	)
	SELECT namespace, worker_id, was, status FROM up
	UNION ALL
	SELECT namespace, worker_id, status, status FROM cur WHERE NOT due`

// Commit writes records to the outbox as one row and commits tx, in one
// round trip.
func Commit(ctx context.Context, tx *pg.BatchTx, records []outbox.Record) error {
	b := &pgx.Batch{}
	if len(records) > 0 {
		sql, args, err := outbox.Insert(ctx, records...)
		if err != nil {
			return err
		}
		b.Queue(sql, args...)
	}
	return tx.Commit(ctx, b, "write outbox")
}
