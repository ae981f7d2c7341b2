package group

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/streams/internal/catalog"
	"github.com/razorbill/flo/services/streams/internal/pending"
	"github.com/razorbill/flo/services/streams/internal/record"
	"github.com/razorbill/flo/services/streams/internal/store"
)

// MaxSettleIDs bounds the ids of one ack or nack.
const MaxSettleIDs = 10_000

// settlement is one Ack or Nack call.
type settlement struct {
	key    store.GroupKey
	ids    []record.ID
	nack   bool
	delay  time.Duration
	reason string
	// uncounted takes the nacked records' last delivery back: no consumer
	// saw it.
	uncounted bool
}

// Ack settles records of a group and returns how many of ids were pending.
func (g *Groups) Ack(ctx context.Context, key store.GroupKey, ids []string) (int, error) {
	s, err := newSettlement(key, ids)
	if err != nil {
		return 0, err
	}
	n, err := g.settler.Do(ctx, s)
	if err == nil {
		g.acked.Add(ctx, int64(n))
	}
	return n, err
}

// Nack hands records back to the group for redelivery after delay (to any
// consumer) and returns how many of ids were pending. reason is kept as the
// records' last error, shown on dead-lettered records.
func (g *Groups) Nack(ctx context.Context, key store.GroupKey, ids []string, delay time.Duration, reason string) (int, error) {
	if delay < 0 {
		return 0, fault.Invalidf("delay_ms must not be negative")
	}
	return g.handBack(ctx, key, ids, settlement{delay: min(delay, MaxNackDelay), reason: reason})
}

// Release hands records back to the group at once, as a nack without delay,
// and takes their last delivery back: the gateway releases the records a
// read took that never reached a worker, which must not bring them closer
// to their group's max deliveries.
func (g *Groups) Release(ctx context.Context, key store.GroupKey, ids []string, reason string) (int, error) {
	return g.handBack(ctx, key, ids, settlement{uncounted: true, reason: reason})
}

// handBack nacks ids of key as how says (its delay, reason and uncounted).
func (g *Groups) handBack(ctx context.Context, key store.GroupKey, ids []string, how settlement) (int, error) {
	s, err := newSettlement(key, ids)
	if err != nil {
		return 0, err
	}
	// The reason is free text: repaired and capped, never refused, since a
	// settle shares its transaction with other calls.
	s.nack, s.delay, s.uncounted, s.reason = true, how.delay, how.uncounted, text.Clean(how.reason, text.MaxFreeBytes)
	n, err := g.settler.Do(ctx, s)
	if err == nil {
		g.nacked.Add(ctx, int64(n))
	}
	return n, err
}

func newSettlement(key store.GroupKey, ids []string) (settlement, error) {
	if err := catalog.ValidateGroupKey(key); err != nil {
		return settlement{}, err
	}
	switch {
	case len(ids) > MaxSettleIDs:
		return settlement{}, fault.Invalidf("ids: %d ids, at most %d", len(ids), MaxSettleIDs)
	}
	parsed, err := record.ParseIDs("ids", ids)
	if err != nil {
		return settlement{}, err
	}
	return settlement{key: key, ids: parsed}, nil
}

// settle runs one coalesced batch of acks and nacks in one transaction.
func (g *Groups) settle(ctx context.Context, calls []*coalesce.Call[settlement, int]) error {
	keys := make([]store.GroupKey, 0, len(calls))
	for _, c := range calls {
		if !slices.Contains(keys, c.Req.key) {
			keys = append(keys, c.Req.key)
		}
	}
	groups, err := g.resolve(ctx, keys)
	if err != nil {
		return err
	}
	live := calls[:0:0]
	for _, c := range calls {
		if _, ok := groups[c.Req.key]; !ok {
			c.Err = g.missing(ctx, c.Req.key)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return nil
	}
	var (
		wakes []wakeAt
		gone  map[int64]bool
	)
	for attempt := 1; ; attempt++ {
		wakes, gone, err = g.settleTx(ctx, live, groups)
		if err == nil || !isRetryable(err) || attempt == 3 {
			break
		}
	}
	if err != nil {
		return err
	}
	for _, c := range live {
		grp := groups[c.Req.key].Group
		switch {
		case gone[grp.ID]:
			// Deleted since it was looked up: nothing of it was settled.
			g.forget(c.Req.key)
			c.Err = g.missing(ctx, c.Req.key)
		case grp.Mode == store.ModeKeyShared && !c.Req.nack && c.Resp > 0:
			// The ack frees keys: their next records may go out now.
			wakes = append(wakes, wakeAt{group: grp.ID})
		}
	}
	for _, w := range wakes {
		if w.at.IsZero() {
			g.hub.Wake(GroupKey(w.group))
		} else {
			g.hub.WakeAt(GroupKey(w.group), w.at)
		}
	}
	return nil
}

// missing is the fault for a call whose group did not resolve.
func (g *Groups) missing(ctx context.Context, k store.GroupKey) error {
	if _, err := g.catalog.GetGroup(ctx, k); err != nil {
		return err
	}
	// Created since the batch resolved it; rare enough to just say so.
	return catalog.GroupNotFound(k)
}

// wakeAt is a group to wake after commit: now (zero at) or at a time.
type wakeAt struct {
	group int64
	at    time.Time
}

// settleTx applies the calls in order to the ranges holding their records
// and writes the result; call responses are set only when it commits. It
// also returns the ids of groups that no longer exist.
func (g *Groups) settleTx(ctx context.Context, calls []*coalesce.Call[settlement, int], groups map[store.GroupKey]store.GroupOf) ([]wakeAt, map[int64]bool, error) {
	var (
		counts = make([]int, len(calls))
		wakes  []wakeAt
		gone   map[int64]bool
	)
	err := pg.InBatchTx(ctx, g.pool, func(tx *pg.BatchTx) error {
		wakes = wakes[:0]
		var (
			targets []store.Target
			ids     []int64
			keyed   []int64
		)
		for _, c := range calls {
			grp := groups[c.Req.key].Group
			gid := grp.ID
			if !slices.Contains(ids, gid) {
				ids = append(ids, gid)
				if grp.Mode == store.ModeKeyShared {
					keyed = append(keyed, gid)
				}
			}
			for _, id := range c.Req.ids {
				targets = append(targets, store.Target{GroupID: gid, Partition: id.Partition(), Offset: id.Offset()})
			}
		}
		if len(keyed) > 0 {
			if err := store.ShareCursors(ctx, tx, keyed); err != nil {
				return err
			}
		}
		held, exist, err := lockRanges(ctx, tx, targets, ids)
		if err != nil {
			return err
		}
		gone = map[int64]bool{}
		for _, id := range ids {
			if !exist[id] {
				gone[id] = true
			}
		}
		now := time.Now()
		// owners[range id][offset] is the nack call (index+1) that takes
		// the record out of its range.
		owners := map[int64]map[int64]int{}
		touched := map[int64]bool{}
		for i, c := range calls {
			grp := groups[c.Req.key]
			counts[i] = 0
			for _, id := range c.Req.ids {
				r := held.find(grp.Group.ID, id.Partition(), id.Offset())
				if r == nil || r.IsSettled(id.Offset()) {
					continue
				}
				touched[r.ID] = true
				off := id.Offset()
				if c.Req.nack {
					if owners[r.ID] == nil {
						owners[r.ID] = map[int64]int{}
					}
					if owners[r.ID][off] == 0 {
						owners[r.ID][off] = i + 1
						counts[i]++
					}
					continue
				}
				r.Settle(off)
				delete(owners[r.ID], off)
				counts[i]++
			}
		}
		var ch store.Changes
		for _, r := range held.all {
			if !touched[r.ID] {
				continue
			}
			own := owners[r.ID]
			if len(own) == 0 {
				if r.Unsettled == 0 {
					ch.Delete = append(ch.Delete, r.ID)
				} else {
					ch.Update = append(ch.Update, *r)
				}
				continue
			}
			pieces := r.Split(func(off int64) int { return own[off] })
			maxDeliveries := 0
			for _, grp := range groups {
				if grp.Group.ID == r.GroupID {
					maxDeliveries = int(grp.Group.MaxDeliveries)
				}
			}
			for k := range pieces {
				o := pieces[k].Owner
				if o == 0 {
					continue
				}
				p := &pieces[k].Range
				c := calls[o-1].Req
				p.Consumer, p.LastError = "", c.reason
				p.RedeliverAt = now.Add(c.delay)
				if c.uncounted && p.Deliveries > 0 {
					p.Deliveries--
				}
				if p.Deliveries >= maxDeliveries {
					// Out of deliveries: no point waiting out the
					// delay before dead-lettering.
					p.RedeliverAt = now
				}
				w := wakeAt{group: r.GroupID}
				if p.RedeliverAt.After(now) {
					w.at = p.RedeliverAt
				}
				wakes = append(wakes, w)
			}
			replace(&ch, *r, pieces)
		}
		return store.Commit(ctx, tx, ch)
	})
	if err != nil {
		return nil, nil, err
	}
	for i, c := range calls {
		c.Resp = counts[i]
	}
	return wakes, gone, nil
}

// heldRanges are the ranges a settlement locked, by group and partition.
type heldRanges struct {
	all   []*pending.Range
	index map[[2]int64][]*pending.Range // sorted by First
}

func (h *heldRanges) find(groupID int64, partition int32, off int64) *pending.Range {
	rs := h.index[[2]int64{groupID, int64(partition)}]
	i, _ := slices.BinarySearchFunc(rs, off, func(r *pending.Range, off int64) int {
		switch {
		case r.Last < off:
			return -1
		case r.First > off:
			return 1
		}
		return 0
	})
	if i < len(rs) && rs[i].Contains(off) {
		return rs[i]
	}
	return nil
}

// lockRanges locks the ranges holding targets and returns which of groups
// still exist. A range can be replaced (split by a nack or a redelivery on
// another replica) between the lookup and the lock; the replacement is found
// by looking again for the targets the first pass did not cover.
func lockRanges(ctx context.Context, tx *pg.BatchTx, targets []store.Target, groups []int64) (*heldRanges, map[int64]bool, error) {
	h := &heldRanges{index: map[[2]int64][]*pending.Range{}}
	seen := map[int64]bool{}
	todo := targets
	var exist map[int64]bool
	for pass := 0; pass < 3 && len(todo) > 0; pass++ {
		rs, ex, err := store.LockRangesAt(ctx, tx, todo, groups)
		if err != nil {
			return nil, nil, err
		}
		if pass == 0 {
			exist, groups = ex, nil
		}
		added := false
		for i := range rs {
			if seen[rs[i].ID] {
				continue
			}
			seen[rs[i].ID] = true
			added = true
			r := &rs[i]
			h.all = append(h.all, r)
			k := [2]int64{r.GroupID, int64(r.Partition)}
			h.index[k] = append(h.index[k], r)
		}
		for k := range h.index {
			slices.SortFunc(h.index[k], func(a, b *pending.Range) int { return cmp.Compare(a.First, b.First) })
		}
		if !added {
			break
		}
		var rest []store.Target
		for _, t := range todo {
			if h.find(t.GroupID, t.Partition, t.Offset) == nil {
				rest = append(rest, t)
			}
		}
		todo = rest
	}
	return h, exist, nil
}
