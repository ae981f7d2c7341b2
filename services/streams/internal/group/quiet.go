package group

import (
	"sync"

	"github.com/razorbill/flo/services/streams/internal/store"
)

// quietGroups remembers, per group, that a read looked and found nothing,
// so that the group's next blocked reads (a consumer renewing its long poll)
// wait at once instead of looking again: 10,000 idle consumers renewing
// their reads then cost no transactions. A look found nothing as of the hub
// stamp of the group's keys taken before it; the memory holds while the
// stamp does (no wake-up since, the keys never without waiters) and no read
// of this replica handed out records since. What other replicas change
// meanwhile is caught as a missed wake-up is: by the hub's safety probe.
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
	if e.changes == changes {
		e.stamp, e.due = stamp, due
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

// still returns what the group's last look found, if it holds at stamp.
func (q *quietGroups) still(groupID int64, stamp uint64) (store.Due, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.m[groupID]
	if e == nil || stamp == 0 || e.stamp != stamp {
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
