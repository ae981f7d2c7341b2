package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/streams/internal/pending"
)

// Group is a row of groups.
type Group struct {
	ID            int64
	StreamID      int64
	Name          string
	MaxDeliveries int32
	// Mode is how records spread over consumers: one of the Mode constants.
	Mode      string
	CreatedAt time.Time
}

// Group modes.
const (
	ModeShared    = "shared"
	ModeExclusive = "exclusive"
	ModeKeyShared = "key_shared"
)

// fields are the scan targets of groupCols.
func (g *Group) fields() []any {
	return []any{&g.ID, &g.StreamID, &g.Name, &g.MaxDeliveries, &g.Mode, &g.CreatedAt}
}

// GroupOf is a group with its stream.
type GroupOf struct {
	Stream Stream
	Group  Group
}

// GroupState is a group with what it has handed out: Cursors[p] is the next
// offset of partition p never handed to it, Pending the records handed out
// and not settled.
type GroupState struct {
	Group   Group
	Cursors []int64
	Pending int64
}

// GroupKey names a group.
type GroupKey struct {
	Namespace, Stream, Group string
}

const groupCols = `g.id, g.stream_id, g.name, g.max_deliveries, g.mode, g.created_at`

// InsertGroup stores a group of stream with one cursor per partition
// (cursors[p] for partition p); an existing name is pg.ErrConflict.
func InsertGroup(ctx context.Context, db DB, streamID int64, name string, maxDeliveries int32, mode string, cursors []int64) (Group, error) {
	var g Group
	err := db.QueryRow(ctx, `
		WITH g AS (
			INSERT INTO groups (stream_id, name, max_deliveries, mode) VALUES ($1, $2, $3, $5)
			RETURNING *
		), c AS (
			INSERT INTO cursors (group_id, partition, next_offset)
			SELECT g.id, p.partition - 1, p.next_offset
			FROM g, unnest($4::bigint[]) WITH ORDINALITY AS p(next_offset, partition)
		)
		SELECT `+groupCols+` FROM g`,
		streamID, name, maxDeliveries, cursors, mode).Scan(g.fields()...)
	if err != nil {
		return Group{}, fmt.Errorf("insert group %s: %w", name, pg.MapError(err))
	}
	return g, nil
}

// GetGroup reads a group and its stream by names.
func GetGroup(ctx context.Context, db DB, k GroupKey) (GroupOf, error) {
	var g Group
	row := db.QueryRow(ctx, `
		SELECT `+streamCols+`, `+groupCols+`
		FROM groups g JOIN streams s ON s.id = g.stream_id
		WHERE s.namespace = $1 AND s.name = $2 AND g.name = $3`,
		k.Namespace, k.Stream, k.Group)
	s, err := scanStream(row, g.fields()...)
	if err != nil {
		return GroupOf{}, fmt.Errorf("get group %s/%s/%s: %w", k.Namespace, k.Stream, k.Group, pg.MapError(err))
	}
	return GroupOf{Stream: s, Group: g}, nil
}

// ResolveGroups reads the groups named by keys; names that do not exist are
// missing from the result.
func ResolveGroups(ctx context.Context, db DB, keys []GroupKey) (map[GroupKey]GroupOf, error) {
	ns := make([]string, len(keys))
	streams := make([]string, len(keys))
	groups := make([]string, len(keys))
	for i, k := range keys {
		ns[i], streams[i], groups[i] = k.Namespace, k.Stream, k.Group
	}
	rows, err := db.Query(ctx, `
		SELECT `+streamCols+`, `+groupCols+`
		FROM unnest($1::text[], $2::text[], $3::text[]) AS k(namespace, stream, grp)
		JOIN streams s ON s.namespace = k.namespace AND s.name = k.stream
		JOIN groups g ON g.stream_id = s.id AND g.name = k.grp`,
		ns, streams, groups)
	if err != nil {
		return nil, fmt.Errorf("resolve groups: %w", err)
	}
	defer rows.Close()
	out := make(map[GroupKey]GroupOf, len(keys))
	for rows.Next() {
		var g Group
		s, err := scanStream(rows, g.fields()...)
		if err != nil {
			return nil, fmt.Errorf("resolve groups: %w", err)
		}
		out[GroupKey{Namespace: s.Namespace, Stream: s.Name, Group: g.Name}] = GroupOf{Stream: s, Group: g}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("resolve groups: %w", err)
	}
	return out, nil
}

// ListGroups lists a stream's groups named after after, by name, with their
// cursors and pending counts: up to limit of them, or all when limit is zero.
func ListGroups(ctx context.Context, db DB, streamID int64, after string, limit int) ([]GroupState, error) {
	rows, err := db.Query(ctx, `
		SELECT `+groupCols+`,
			ARRAY(SELECT c.next_offset FROM cursors c WHERE c.group_id = g.id ORDER BY c.partition),
			COALESCE((SELECT sum(p.unsettled) FROM pending p WHERE p.group_id = g.id), 0)
		FROM groups g
		WHERE g.stream_id = $1 AND g.name > $2
		ORDER BY g.name
		LIMIT NULLIF($3, 0)`, streamID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (GroupState, error) {
		var st GroupState
		g := &st.Group
		err := r.Scan(append(g.fields(), &st.Cursors, &st.Pending)...)
		return st, err
	})
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	return out, nil
}

// StreamGroupState is a group's state with its stream.
type StreamGroupState struct {
	Stream Stream
	GroupState
}

// ListAllGroups lists every group of every stream with its cursors and
// pending count, in one statement.
func ListAllGroups(ctx context.Context, db DB) ([]StreamGroupState, error) {
	rows, err := db.Query(ctx, `
		SELECT `+streamCols+`, `+groupCols+`,
			ARRAY(SELECT c.next_offset FROM cursors c WHERE c.group_id = g.id ORDER BY c.partition),
			COALESCE((SELECT sum(p.unsettled) FROM pending p WHERE p.group_id = g.id), 0)
		FROM groups g JOIN streams s ON s.id = g.stream_id
		ORDER BY s.namespace, s.name, g.name`)
	if err != nil {
		return nil, fmt.Errorf("list all groups: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StreamGroupState, error) {
		var st StreamGroupState
		g := &st.Group
		stream, err := scanStream(r, append(g.fields(), &st.Cursors, &st.Pending)...)
		st.Stream = stream
		return st, err
	})
	if err != nil {
		return nil, fmt.Errorf("list all groups: %w", err)
	}
	return out, nil
}

// DeleteGroup deletes a group with its cursors and pending ranges.
func DeleteGroup(ctx context.Context, db DB, streamID int64, name string) (Group, error) {
	var g Group
	err := db.QueryRow(ctx, `DELETE FROM groups g WHERE g.stream_id = $1 AND g.name = $2 RETURNING `+groupCols, streamID, name).
		Scan(g.fields()...)
	if err != nil {
		return Group{}, fmt.Errorf("delete group %s: %w", name, pg.MapError(err))
	}
	return g, nil
}

// LockForRead starts a group read in transaction tx, in one round trip: it
// locks up to limit of the group's ranges due at now, earliest first,
// skipping ranges another transaction holds (a concurrent read takes those),
// and the group's cursors, returned by partition (nil when the group no
// longer exists). Concurrent reads of one group on different replicas take
// turns on the cursors, so each offset is handed out once.
//
// The transaction commits without waiting for its WAL to reach disk, so the
// cursors are locked for a shorter time. A read lost in a Postgres crash
// only moves the cursors back: its records are handed out again, as if
// redelivered, and nothing is skipped. A read's records are acked only after
// the read committed, and an ack's commit waits for the WAL up to it, so
// an acked record's read is never lost.
//
// With withLease (exclusive groups) it also returns the group's lease, read
// after the cursors are locked, so it is the one the previous read wrote.
func LockForRead(ctx context.Context, tx *pg.BatchTx, groupID int64, now time.Time, limit int, withLease bool) ([]pending.Range, []int64, Lease, error) {
	var b pgx.Batch
	b.Queue(`SET LOCAL synchronous_commit = off`)
	b.Queue(`
		SELECT `+rangeCols+` FROM pending
		WHERE group_id = $1 AND redeliver_at <= $2
		ORDER BY redeliver_at, id
		LIMIT $3
		FOR UPDATE SKIP LOCKED`, groupID, now, limit)
	b.Queue(`SELECT partition, next_offset FROM cursors WHERE group_id = $1 ORDER BY partition FOR UPDATE`, groupID)
	if withLease {
		b.Queue(`SELECT owner, owner_until FROM groups WHERE id = $1`, groupID)
	}
	res := tx.SendBatch(ctx, &b)
	defer res.Close()
	var lease Lease
	if _, err := res.Exec(); err != nil {
		return nil, nil, lease, fmt.Errorf("set commit mode: %w", err)
	}
	rows, err := res.Query()
	if err != nil {
		return nil, nil, lease, fmt.Errorf("lock due ranges: %w", err)
	}
	due, err := scanRanges(rows)
	if err != nil {
		return nil, nil, lease, fmt.Errorf("lock due ranges: %w", err)
	}
	if rows, err = res.Query(); err != nil {
		return nil, nil, lease, fmt.Errorf("lock cursors: %w", err)
	}
	cursors, err := scanCursors(rows)
	if err != nil {
		return nil, nil, lease, fmt.Errorf("lock cursors: %w", err)
	}
	if withLease && cursors != nil {
		lease.GroupID = groupID
		if err := res.QueryRow().Scan(&lease.Owner, &lease.Until); err != nil {
			return nil, nil, lease, fmt.Errorf("read lease: %w", err)
		}
	}
	if err := res.Close(); err != nil {
		return nil, nil, lease, fmt.Errorf("lock for read: %w", err)
	}
	return due, cursors, lease, nil
}

// LockForKeyRead starts a read of a key_shared group in transaction tx, in
// one round trip: it locks the group's cursors (so reads of the group take
// turns, on every replica) and then every pending range of the group, whose
// records' keys decide which keys are held. The cursors are nil when the
// group no longer exists. It commits without waiting for the WAL, as
// LockForRead does and for the same reasons.
func LockForKeyRead(ctx context.Context, tx *pg.BatchTx, groupID int64) ([]pending.Range, []int64, error) {
	var b pgx.Batch
	b.Queue(`SET LOCAL synchronous_commit = off`)
	b.Queue(`SELECT partition, next_offset FROM cursors WHERE group_id = $1 ORDER BY partition FOR UPDATE`, groupID)
	b.Queue(`SELECT `+rangeCols+` FROM pending WHERE group_id = $1 ORDER BY id FOR UPDATE`, groupID)
	res := tx.SendBatch(ctx, &b)
	defer res.Close()
	if _, err := res.Exec(); err != nil {
		return nil, nil, fmt.Errorf("set commit mode: %w", err)
	}
	rows, err := res.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("lock cursors: %w", err)
	}
	cursors, err := scanCursors(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("lock cursors: %w", err)
	}
	if rows, err = res.Query(); err != nil {
		return nil, nil, fmt.Errorf("lock pending ranges: %w", err)
	}
	ranges, err := scanRanges(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("lock pending ranges: %w", err)
	}
	if err := res.Close(); err != nil {
		return nil, nil, fmt.Errorf("lock for key read: %w", err)
	}
	return ranges, cursors, nil
}

// ShareCursors takes a share lock on the cursors of groups (key_shared
// groups settling records) in transaction tx. A key_shared read holds its
// group's cursors for update while it reads every pending range, so it
// waits for settlements under way and then sees the ranges they inserted
// (a nack replaces a range), which a read that had started its range query
// would miss. Cursors are locked in (group, partition) order, as reads do.
func ShareCursors(ctx context.Context, tx *pg.BatchTx, groups []int64) error {
	if _, err := tx.Exec(ctx, `
		SELECT 1 FROM cursors WHERE group_id = ANY($1)
		ORDER BY group_id, partition FOR SHARE`, groups); err != nil {
		return fmt.Errorf("share cursors: %w", err)
	}
	return nil
}

// Lease is the hold of an exclusive group's consumer: Owner reads the group
// alone until Until.
type Lease struct {
	GroupID int64
	Owner   string
	Until   time.Time
}

// scanCursors reads (partition, next_offset) rows ordered by partition.
func scanCursors(rows pgx.Rows) ([]int64, error) {
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var (
			p    int32
			next int64
		)
		if err := rows.Scan(&p, &next); err != nil {
			return nil, err
		}
		if int(p) != len(out) {
			return nil, errors.New("partitions are not numbered 0..n-1")
		}
		out = append(out, next)
	}
	return out, rows.Err()
}

// Cursor is a new position of one partition's cursor.
type Cursor struct {
	GroupID   int64
	Partition int32
	Next      int64
}
