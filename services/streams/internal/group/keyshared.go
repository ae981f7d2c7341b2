package group

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/streams/internal/logread"
	"github.com/razorbill/flo/services/streams/internal/pending"
	"github.com/razorbill/flo/services/streams/internal/store"
)

// Limits of key_shared reads: a read parks at most maxParkPerRead records of
// held keys, and none once the group has maxKeyPending records pending
// (handed out or parked); past that a held key's next record stops its
// partition until the key is free.
const (
	maxParkPerRead = 1000
	maxKeyPending  = 10_000
)

// A key_shared read hands all records of one key to one consumer at a time,
// in offset order (a key's records are all in the partition the key hashes
// to). A key is held while one of its records is handed out and neither
// settled nor past its message timeout (or nack delay): no consumer gets its
// other records then, and a read hands out at most one record of a key, so
// the next one follows only after the consumer acked it. Records of held keys
// that a read passes while taking new records are parked: stored as pending
// ranges with no consumer and no delivery, so the cursor moves on and the
// parked records go out, in order, once their key is free. Keyless records
// go to any consumer. Nothing of the keys is stored: a read locks the cursors
// and every pending range of the group and reads the keys of their records
// from the log (mostly the read cache), which is why pending is bounded.

// readKeys runs the read transaction of a key_shared group for the calls of
// sh: ready records first (parked ones, timed out or nacked ones due again),
// then new records from the cursors. It returns how many records it moved to
// the dead-letter stream.
func (g *Groups) readKeys(ctx context.Context, tx *pg.BatchTx, grp store.GroupOf, sh *share, now time.Time) (int, error) {
	ranges, cursors, err := store.LockForKeyRead(ctx, tx, grp.Group.ID)
	if err != nil {
		return 0, err
	}
	if cursors == nil {
		return 0, errGroupGone
	}
	k := keyRead{g: g, grp: grp, sh: sh, now: now, held: map[string]time.Time{}}
	var expired []pending.Range
	for _, r := range ranges {
		k.pending += r.Unsettled
		live := r.Deliveries > 0 && r.RedeliverAt.After(now)
		if !live && r.Deliveries >= int(grp.Group.MaxDeliveries) {
			expired = append(expired, r)
			continue
		}
		recs, err := g.fetchOffsets(ctx, grp.Stream.Topic(), r.Partition, r.Open())
		if err != nil {
			return 0, err
		}
		if !live {
			k.ready = append(k.ready, readyRange{r: r, recs: recs})
			continue
		}
		for _, rec := range recs {
			k.hold(rec, r.RedeliverAt)
		}
	}
	dead := 0
	if len(expired) > 0 {
		if dead, err = g.deadLetter(ctx, grp, expired, &k.ch); err != nil {
			return 0, err
		}
	}
	slices.SortFunc(k.ready, func(a, b readyRange) int {
		return cmp.Or(cmp.Compare(a.r.Partition, b.r.Partition), cmp.Compare(a.r.First, b.r.First))
	})
	for _, rr := range k.ready {
		k.handReady(rr)
	}
	if sh.next() >= 0 {
		if err := k.takeNew(ctx, cursors); err != nil {
			return 0, err
		}
	}
	return dead, store.Commit(ctx, tx, k.ch)
}

// keyRead is the state of one key_shared read transaction.
type keyRead struct {
	g   *Groups
	grp store.GroupOf
	sh  *share
	now time.Time
	// held maps each held key to when it is free at the latest (its
	// record's redelivery time).
	held map[string]time.Time
	// ready are the ranges whose records may go out: parked or due.
	ready []readyRange
	// pending counts the group's unsettled records, parked ones included.
	pending int
	parked  int
	ch      store.Changes
}

// readyRange is a range of records that may go out, with its log records.
type readyRange struct {
	r    pending.Range
	recs map[int64]*kgo.Record
}

// hold marks rec's key held until at, unless it is keyless.
func (k *keyRead) hold(rec *kgo.Record, at time.Time) {
	if len(rec.Key) == 0 {
		return
	}
	key := string(rec.Key)
	if t, ok := k.held[key]; !ok || at.Before(t) {
		k.held[key] = at
	}
}

// heldUntil reports whether rec's key is held, and until when.
func (k *keyRead) heldUntil(rec *kgo.Record) (time.Time, bool) {
	if len(rec.Key) == 0 {
		return time.Time{}, false
	}
	t, ok := k.held[string(rec.Key)]
	return t, ok
}

// give hands rec to the next call that takes records and holds its key;
// it returns the call's index, -1 when every call has what it wants.
func (k *keyRead) give(rec *kgo.Record, deliveries int) int {
	i := k.sh.next()
	if i < 0 {
		return -1
	}
	k.sh.give(i, rec, deliveries)
	k.hold(rec, k.now.Add(k.sh.calls[i].req.MessageTimeout))
	return i
}

// handReady hands out what it can of a ready range, in offset order. Records
// the log no longer holds are settled. The records left keep the range's
// state; parked ones are due again when their key is free at the latest, so
// a blocked read waits for that instead of polling.
func (k *keyRead) handReady(rr readyRange) {
	r := rr.r
	taker := map[int64]int{}
	wake := map[int64]time.Time{}
	changed := false
	for _, off := range r.Open() {
		rec := rr.recs[off]
		if rec == nil {
			r.Settle(off) // removed by retention
			changed = true
			continue
		}
		if until, ok := k.heldUntil(rec); ok {
			wake[off] = until
			continue
		}
		i := k.give(rec, r.Deliveries+1)
		if i < 0 {
			wake[off] = k.now
			continue
		}
		taker[off] = i + 1
		changed = true
	}
	pieces := r.Split(func(off int64) int { return taker[off] })
	for j := range pieces {
		p := &pieces[j].Range
		if o := pieces[j].Owner; o > 0 {
			claim(p, k.sh.calls[o-1].req, r.Deliveries+1, k.now)
			continue
		}
		if r.Deliveries == 0 {
			at := earliest(p.Open(), wake)
			changed = changed || !at.Equal(r.RedeliverAt)
			p.RedeliverAt = at
		}
	}
	if changed {
		replace(&k.ch, r, pieces)
	}
}

// earliest is the earliest of wake's times at offsets.
func earliest(offsets []int64, wake map[int64]time.Time) time.Time {
	var at time.Time
	for _, off := range offsets {
		if t := wake[off]; at.IsZero() || t.Before(at) {
			at = t
		}
	}
	return at
}

// takeNew hands the calls records past the cursors, a partition at a time
// from a rotating one, parking records of held keys. A partition stops at
// the first record it can neither hand out nor park.
func (k *keyRead) takeNew(ctx context.Context, cursors []int64) error {
	want := k.sh.wanted() + min(maxParkPerRead, max(0, maxKeyPending-k.pending))
	n := len(cursors)
	first := int(k.g.rotate.Add(1) % uint32(n))
	wants := make([]logread.Want, n)
	for i := range wants {
		p := int32((first + i) % n)
		wants[i] = logread.Want{Partition: p, From: cursors[p], Max: want}
	}
	gots, err := k.g.reader.Read(ctx, k.grp.Stream.Topic(), wants)
	if err != nil {
		return err
	}
	for _, got := range gots {
		if k.sh.next() < 0 {
			break
		}
		p := got.Partition
		next := max(cursors[p], got.From) // retention removed records before From
		run := newRun(k.grp.Group.ID, p)
		var runWake time.Time
		for _, rec := range got.Records {
			owner := -2 // parked
			until, held := k.heldUntil(rec)
			if held {
				if k.parked >= maxParkPerRead || k.pending+k.parked >= maxKeyPending {
					break
				}
				k.parked++
			} else if owner = k.give(rec, 1); owner < 0 {
				break
			}
			if owner != run.call {
				k.closeRun(run, runWake)
				run.call, runWake = owner, time.Time{}
			}
			if held && (runWake.IsZero() || until.Before(runWake)) {
				runWake = until
			}
			run.add(rec)
			next = rec.Offset + 1
		}
		k.closeRun(run, runWake)
		if next != cursors[p] {
			k.ch.Cursors = append(k.ch.Cursors, store.Cursor{GroupID: k.grp.Group.ID, Partition: p, Next: next})
		}
	}
	return nil
}

// closeRun writes a run of new records as a range: its call's, or parked
// until wake when its call is -2.
func (k *keyRead) closeRun(r *run, wake time.Time) {
	if r.call != -2 {
		r.close(k.sh, k.now, &k.ch)
		return
	}
	if len(r.offsets) > 0 {
		rg := pending.New(r.groupID, r.partition, r.offsets, r.stamps)
		rg.DeliveredAt, rg.RedeliverAt = k.now, wake
		k.ch.Insert = append(k.ch.Insert, rg)
	}
	r.offsets, r.stamps = nil, nil
}
