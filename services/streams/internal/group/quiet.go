package group

import (
	"sync"
	"time"

	"github.com/razorbill/flo/services/streams/internal/store"
)

// quietGroups remembers, per group, that a read transaction looked and
// found nothing, so that the group's next blocked reads wait at once instead
// of looking again: 10,000 idle consumers renewing their long polls cost no
// transactions, and of 10,000 reads woken by one append, the few that take
// the record and then one that finds nothing left look. A look found nothing
// as of the hub stamp of the group's keys taken before it; the memory holds
// while the stamp does (no wake-up since, the keys never without waiters),
// no read of this replica handed out records since, and the group's earliest
// due range (or a running exclusive lease) has not come due. What other
// replicas change meanwhile is caught as a missed wake-up is: by the hub's
// safety probe, whose reads always look.
type quietGroups struct {
	mu sync.Mutex
	m  map[int64]*quiet
}

// quiet is what the last look of a group found.
type quiet struct {
	// changes counts the reads that handed out records, so a look that
	// raced one is not remembered.
	changes uint64
	// stamp is the hub stamp before the look, 0 when nothing is known.
	stamp uint64
	due   store.Due
	// until is when due says the group may have records; zero for never.
	until time.Time
}

// before returns the group's change count, to pass to found after a look.
func (q *quietGroups) before(groupID int64) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e := q.m[groupID]; e != nil {
		return e.changes
	}
	return 0
}

// found remembers that a look that began at changes and stamp found
// nothing and due, unless records were handed out since it began.
func (q *quietGroups) found(groupID int64, changes, stamp uint64, due store.Due) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.m[groupID]
	if e == nil {
		if q.m == nil {
			q.m = map[int64]*quiet{}
		}
		e = &quiet{}
		q.m[groupID] = e
	}
	if e.changes != changes {
		return
	}
	now := time.Now()
	e.stamp, e.due, e.until = stamp, due, due.Pending
	if due.OwnerUntil.After(now) && (e.until.IsZero() || due.OwnerUntil.Before(e.until)) {
		e.until = due.OwnerUntil
	}
}

// changed forgets what the group's last look found: a read handed out
// records.
func (q *quietGroups) changed(groupID int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e := q.m[groupID]; e != nil {
		e.changes++
		e.stamp = 0
	}
}

// still returns what the group's last look found, if it holds at stamp and
// now.
func (q *quietGroups) still(groupID int64, stamp uint64, now time.Time) (store.Due, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.m[groupID]
	if e == nil || stamp == 0 || e.stamp != stamp || (!e.until.IsZero() && !now.Before(e.until)) {
		return store.Due{}, false
	}
	return e.due, true
}

// drop forgets the group, deleted.
func (q *quietGroups) drop(groupID int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.m, groupID)
}
