package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/streams/internal/pending"
)

const rangeCols = `id, group_id, partition, first_offset, last_offset, settled, stamps, unsettled,
	consumer, deliveries, delivered_at, redeliver_at, last_error`

func scanRanges(rows pgx.Rows) ([]pending.Range, error) {
	defer rows.Close()
	var out []pending.Range
	for rows.Next() {
		var (
			r      pending.Range
			stamps []byte
		)
		if err := rows.Scan(&r.ID, &r.GroupID, &r.Partition, &r.First, &r.Last, &r.Settled, &stamps, &r.Unsettled,
			&r.Consumer, &r.Deliveries, &r.DeliveredAt, &r.RedeliverAt, &r.LastError); err != nil {
			return nil, err
		}
		var err error
		if r.Stamps, err = pending.DecodeStamps(stamps, r.Len()); err != nil {
			return nil, fmt.Errorf("range %d: %w", r.ID, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Target is one record of a group, by partition and offset.
type Target struct {
	GroupID   int64
	Partition int32
	Offset    int64
}

// LockRangesAt locks the ranges holding any of targets, in id order (so
// concurrent settlements never deadlock). In the same round trip it returns
// which of groups still exist (none asked when groups is empty), so a
// settlement needs no query of its own for that.
//
// Targets are looked up as runs of consecutive offsets, since a consumer
// settles mostly what it got together: a run of 100 acked records is one
// lookup, not 100. Every range overlapping a run holds one of its offsets.
// Ranges never overlap, so those are the last range starting at or before
// the run's first offset (if it reaches it) and the ranges starting inside
// the run, both found by index.
func LockRangesAt(ctx context.Context, tx *pg.BatchTx, targets []Target, groups []int64) ([]pending.Range, map[int64]bool, error) {
	runs := slices.Clone(targets)
	slices.SortFunc(runs, func(a, b Target) int {
		return cmp.Or(cmp.Compare(a.GroupID, b.GroupID), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	var (
		rgroups, lo, hi []int64
		parts           []int32
	)
	for i, t := range runs {
		n := len(lo)
		if i > 0 && t.GroupID == rgroups[n-1] && t.Partition == parts[n-1] && t.Offset <= hi[n-1]+1 {
			hi[n-1] = t.Offset
			continue
		}
		rgroups, parts, lo, hi = append(rgroups, t.GroupID), append(parts, t.Partition), append(lo, t.Offset), append(hi, t.Offset)
	}
	var b pgx.Batch
	if len(groups) > 0 {
		b.Queue(`SELECT id FROM groups WHERE id = ANY($1)`, groups)
	}
	b.Queue(`
		SELECT `+rangeCols+` FROM pending
		WHERE id IN (
			SELECT r.id
			FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::bigint[]) AS t(group_id, partition, lo, hi)
			CROSS JOIN LATERAL (
				(SELECT p.id, p.last_offset FROM pending p
				WHERE p.group_id = t.group_id AND p.partition = t.partition AND p.first_offset <= t.lo
				ORDER BY p.first_offset DESC
				LIMIT 1)
				UNION ALL
				SELECT p.id, p.last_offset FROM pending p
				WHERE p.group_id = t.group_id AND p.partition = t.partition AND p.first_offset > t.lo AND p.first_offset <= t.hi
			) r
			WHERE r.last_offset >= t.lo
		)
		ORDER BY id
		FOR UPDATE`, rgroups, parts, lo, hi)
	res := tx.SendBatch(ctx, &b)
	defer res.Close()
	var exist map[int64]bool
	if len(groups) > 0 {
		rows, err := res.Query()
		if err != nil {
			return nil, nil, fmt.Errorf("check groups: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, nil, fmt.Errorf("check groups: %w", err)
		}
		exist = make(map[int64]bool, len(ids))
		for _, id := range ids {
			exist[id] = true
		}
	}
	rows, err := res.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("lock ranges: %w", err)
	}
	out, err := scanRanges(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("lock ranges: %w", err)
	}
	if err := res.Close(); err != nil {
		return nil, nil, fmt.Errorf("lock ranges: %w", err)
	}
	return out, exist, nil
}

// Due is what decides when a group may have records for its consumers
// again: its earliest pending range's redelivery time and the lease of an
// exclusive group.
type Due struct {
	// Pending is when the earliest pending range is due; zero when nothing
	// is pending.
	Pending time.Time
	// Owner holds an exclusive group's lease until OwnerUntil.
	Owner      string
	OwnerUntil time.Time
}

// For is when there may be records for consumer at now: when the earliest
// pending range is due, or, while another consumer holds the lease of an
// exclusive group, when that lease runs out (its due ranges are the
// holder's). ok is false when nothing is pending and no lease runs.
func (d Due) For(consumer string, now time.Time) (at time.Time, ok bool) {
	if d.OwnerUntil.After(now) && d.Owner != consumer {
		return d.OwnerUntil, true
	}
	return d.Pending, !d.Pending.IsZero()
}

// GroupDue reads the group's Due; a group that is gone has a zero one.
func GroupDue(ctx context.Context, db DB, groupID int64) (Due, error) {
	var (
		d       Due
		pending *time.Time
	)
	err := db.QueryRow(ctx, `
		SELECT g.owner, g.owner_until, (SELECT min(redeliver_at) FROM pending WHERE group_id = g.id)
		FROM groups g WHERE g.id = $1`, groupID).Scan(&d.Owner, &d.OwnerUntil, &pending)
	if errors.Is(err, pgx.ErrNoRows) {
		return Due{}, nil
	}
	if err != nil {
		return Due{}, fmt.Errorf("next due range: %w", err)
	}
	if pending != nil {
		d.Pending = *pending
	}
	return d, nil
}

// ListPending returns up to limit of a group's ranges (of one consumer when
// consumer is not empty) holding offsets after after (its GroupID unused),
// by partition and offset, and how many pending records the group (or
// consumer) has in all.
func ListPending(ctx context.Context, db DB, groupID int64, consumer string, after Target, limit int) ([]pending.Range, int64, error) {
	rows, err := db.Query(ctx, `
		SELECT `+rangeCols+` FROM pending
		WHERE group_id = $1 AND ($2 = '' OR consumer = $2) AND (partition, last_offset) > ($3, $4)
		ORDER BY partition, first_offset
		LIMIT $5`, groupID, consumer, after.Partition, after.Offset, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("list pending: %w", err)
	}
	out, err := scanRanges(rows)
	if err != nil {
		return nil, 0, fmt.Errorf("list pending: %w", err)
	}
	var total int64
	if err := db.QueryRow(ctx, `SELECT COALESCE(sum(unsettled), 0) FROM pending WHERE group_id = $1 AND ($2 = '' OR consumer = $2)`,
		groupID, consumer).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("count pending: %w", err)
	}
	return out, total, nil
}

// Changes are the writes of one group read or settlement, sent to Postgres
// in one round trip.
type Changes struct {
	// Delete lists ranges to remove: settled, moved to the dead-letter
	// stream, or replaced by Insert.
	Delete []int64
	// Update rewrites ranges in place (same id and offsets).
	Update []pending.Range
	// Insert adds ranges (new deliveries and the pieces of split ranges).
	Insert []pending.Range
	// Cursors moves cursors forward.
	Cursors []Cursor
	// Lease, when set, is an exclusive group's new lease.
	Lease *Lease
}

// Commit writes changes, deletes first so replacement ranges never overlap
// the ranges they replace, and commits tx, in one round trip.
func Commit(ctx context.Context, tx *pg.BatchTx, c Changes) error {
	var b pgx.Batch
	if len(c.Delete) > 0 {
		b.Queue(`DELETE FROM pending WHERE id = ANY($1)`, c.Delete)
	}
	if len(c.Update) > 0 {
		a := columns(c.Update, false)
		b.Queue(`
			UPDATE pending p SET settled = u.settled, unsettled = u.unsettled, consumer = u.consumer,
				deliveries = u.deliveries, delivered_at = u.delivered_at, redeliver_at = u.redeliver_at,
				last_error = u.last_error
			FROM unnest($1::bigint[], $2::bytea[], $3::int[], $4::text[], $5::int[], $6::timestamptz[], $7::timestamptz[], $8::text[])
				AS u(id, settled, unsettled, consumer, deliveries, delivered_at, redeliver_at, last_error)
			WHERE p.id = u.id`,
			a.ids, a.settled, a.unsettled, a.consumer, a.deliveries, a.deliveredAt, a.redeliverAt, a.lastError)
	}
	if len(c.Insert) > 0 {
		a := columns(c.Insert, true)
		b.Queue(`
			INSERT INTO pending (group_id, partition, first_offset, last_offset, settled, stamps, first_ms, unsettled,
				consumer, deliveries, delivered_at, redeliver_at, last_error)
			SELECT * FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::bigint[], $5::bytea[], $6::bytea[], $7::bigint[],
				$8::int[], $9::text[], $10::int[], $11::timestamptz[], $12::timestamptz[], $13::text[])`,
			a.groups, a.partitions, a.first, a.last, a.settled, a.stamps, a.firstMS,
			a.unsettled, a.consumer, a.deliveries, a.deliveredAt, a.redeliverAt, a.lastError)
	}
	if len(c.Cursors) > 0 {
		groups := make([]int64, len(c.Cursors))
		parts := make([]int32, len(c.Cursors))
		next := make([]int64, len(c.Cursors))
		for i, cur := range c.Cursors {
			groups[i], parts[i], next[i] = cur.GroupID, cur.Partition, cur.Next
		}
		b.Queue(`
			UPDATE cursors c SET next_offset = u.next
			FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS u(group_id, partition, next)
			WHERE c.group_id = u.group_id AND c.partition = u.partition`, groups, parts, next)
	}
	if l := c.Lease; l != nil {
		b.Queue(`UPDATE groups SET owner = $2, owner_until = $3 WHERE id = $1`, l.GroupID, l.Owner, l.Until)
	}
	if err := tx.Commit(ctx, &b); err != nil {
		return fmt.Errorf("write pending ranges: %w", err)
	}
	return nil
}

// rangeColumns is ranges as column arrays, for unnest.
type rangeColumns struct {
	ids, groups, first, last, firstMS []int64
	partitions, unsettled, deliveries []int32
	settled, stamps                   [][]byte
	consumer, lastError               []string
	deliveredAt, redeliverAt          []time.Time
}

// columns splits ranges into column arrays; stamps only when withStamps,
// since updates never change them.
func columns(rs []pending.Range, withStamps bool) rangeColumns {
	n := len(rs)
	a := rangeColumns{
		ids: make([]int64, n), groups: make([]int64, n), first: make([]int64, n), last: make([]int64, n),
		firstMS: make([]int64, n), partitions: make([]int32, n), unsettled: make([]int32, n),
		deliveries: make([]int32, n), settled: make([][]byte, n), stamps: make([][]byte, n),
		consumer: make([]string, n), lastError: make([]string, n),
		deliveredAt: make([]time.Time, n), redeliverAt: make([]time.Time, n),
	}
	for i, r := range rs {
		a.ids[i], a.groups[i], a.first[i], a.last[i] = r.ID, r.GroupID, r.First, r.Last
		a.firstMS[i] = r.Stamps[0]
		a.partitions[i], a.unsettled[i], a.deliveries[i] = r.Partition, int32(r.Unsettled), int32(r.Deliveries)
		a.settled[i] = r.Settled
		if withStamps {
			a.stamps[i] = pending.EncodeStamps(r.Stamps)
		}
		a.consumer[i], a.lastError[i] = r.Consumer, r.LastError
		a.deliveredAt[i], a.redeliverAt[i] = r.DeliveredAt, r.RedeliverAt
	}
	return a
}
