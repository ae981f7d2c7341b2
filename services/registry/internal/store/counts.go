package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// WorkerCount is what to add to one worker's task counters.
type WorkerCount struct {
	Namespace string
	WorkerID  string
	Completed int64
	Failed    int64
}

// ProcessCount is what to add to one process's counters; LastRunAt moves
// forward only.
type ProcessCount struct {
	Namespace string
	WorkerID  string
	Name      string
	Runs      int64
	Fails     int64
	LastRunAt time.Time
}

// AddWorkerCounts adds counts to the workers that exist, in one statement;
// counts of unknown workers are dropped. Rows are locked in key order so
// consumers of different partitions touching the same workers cannot
// deadlock.
func AddWorkerCounts(ctx context.Context, db DB, counts []WorkerCount) error {
	if len(counts) == 0 {
		return nil
	}
	ns := make([]string, len(counts))
	ids := make([]string, len(counts))
	done := make([]int64, len(counts))
	failed := make([]int64, len(counts))
	for i, c := range counts {
		ns[i], ids[i], done[i], failed[i] = c.Namespace, c.WorkerID, c.Completed, c.Failed
	}
	_, err := db.Exec(ctx, `
		WITH c AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS c(namespace, worker_id, completed, failed)
		), locked AS MATERIALIZED (
			SELECT w.namespace, w.worker_id FROM workers w
			JOIN c ON c.namespace = w.namespace AND c.worker_id = w.worker_id
			ORDER BY w.namespace, w.worker_id
			FOR UPDATE OF w
		)
		UPDATE workers w
		SET tasks_completed = w.tasks_completed + c.completed, tasks_failed = w.tasks_failed + c.failed, updated_at = now()
		FROM c JOIN locked l ON l.namespace = c.namespace AND l.worker_id = c.worker_id
		WHERE w.namespace = c.namespace AND w.worker_id = c.worker_id`,
		ns, ids, done, failed)
	if err != nil {
		return fmt.Errorf("add task counts of %d workers: %w", len(counts), err)
	}
	return nil
}

// AddProcessCounts adds counts to the processes of workers that exist, in one
// statement. A process the worker did not list at registration is added as an
// action: task events only come from actions, and its counts should not be
// lost because the worker left it out.
func AddProcessCounts(ctx context.Context, db DB, counts []ProcessCount) error {
	if len(counts) == 0 {
		return nil
	}
	ns := make([]string, len(counts))
	ids := make([]string, len(counts))
	names := make([]string, len(counts))
	runs := make([]int64, len(counts))
	fails := make([]int64, len(counts))
	at := make([]time.Time, len(counts))
	for i, c := range counts {
		ns[i], ids[i], names[i], runs[i], fails[i], at[i] = c.Namespace, c.WorkerID, c.Name, c.Runs, c.Fails, c.LastRunAt
	}
	_, err := db.Exec(ctx, `
		INSERT INTO worker_processes AS p (namespace, worker_id, name, kind, run_count, fail_count, last_run_at)
		SELECT c.namespace, c.worker_id, c.name, 'action', c.runs, c.fails, c.last_run_at
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::timestamptz[])
			AS c(namespace, worker_id, name, runs, fails, last_run_at)
		JOIN workers w ON w.namespace = c.namespace AND w.worker_id = c.worker_id
		ORDER BY c.namespace COLLATE "C", c.worker_id COLLATE "C", c.name COLLATE "C"
		ON CONFLICT (namespace, worker_id, name) DO UPDATE SET
			run_count = p.run_count + EXCLUDED.run_count,
			fail_count = p.fail_count + EXCLUDED.fail_count,
			last_run_at = GREATEST(p.last_run_at, EXCLUDED.last_run_at)`,
		ns, ids, names, runs, fails, at)
	if err != nil {
		return fmt.Errorf("add task counts of %d processes: %w", len(counts), err)
	}
	return nil
}

// LockTallyOffset locks a partition's row of tally_offsets, inserting it
// when missing, and returns the offset of the first record not yet counted.
// A concurrent transaction holding the row makes it wait, then read what that
// one committed.
func LockTallyOffset(ctx context.Context, tx pgx.Tx, topic string, partition int32) (int64, error) {
	const lock = `SELECT next_offset FROM tally_offsets WHERE topic = $1 AND partition = $2 FOR UPDATE`
	var next int64
	err := tx.QueryRow(ctx, lock, topic, partition).Scan(&next)
	if errors.Is(err, pgx.ErrNoRows) {
		// The partition's first batch. Two replicas may both get here: the
		// second insert waits for the first to commit, then does nothing,
		// and the lock below reads the offset the first one left.
		if _, err := tx.Exec(ctx, `INSERT INTO tally_offsets (topic, partition, next_offset) VALUES ($1, $2, 0)
			ON CONFLICT (topic, partition) DO NOTHING`, topic, partition); err != nil {
			return 0, fmt.Errorf("insert tally offset of %s/%d: %w", topic, partition, err)
		}
		err = tx.QueryRow(ctx, lock, topic, partition).Scan(&next)
	}
	if err != nil {
		return 0, fmt.Errorf("lock tally offset of %s/%d: %w", topic, partition, err)
	}
	return next, nil
}

// SetTallyOffset moves a partition's next offset forward to next, never
// back.
func SetTallyOffset(ctx context.Context, tx pgx.Tx, topic string, partition int32, next int64) error {
	_, err := tx.Exec(ctx, `UPDATE tally_offsets SET next_offset = GREATEST(next_offset, $3), updated_at = now()
		WHERE topic = $1 AND partition = $2`, topic, partition, next)
	if err != nil {
		return fmt.Errorf("set tally offset of %s/%d: %w", topic, partition, err)
	}
	return nil
}
