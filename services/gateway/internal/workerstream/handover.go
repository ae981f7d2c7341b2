package workerstream

import (
	"sync"
	"time"
)

// maxHandover caps the tasks and records kept for workers' next streams;
// past it what an ended stream held is dropped, and its worker's late
// reports are refused like any other report of a task it does not hold.
const maxHandover = 100_000

// A worker may report, touch, nack or abandon only the tasks its stream
// holds, and settle only the records it was sent. A worker whose stream
// broke sends the reports of tasks that were running on its next stream,
// so what one stream holds passes to the next stream of the same worker
// (namespace, worker id and key) on this gateway: from a stream still open
// (a worker reconnects before the gateway sees the old stream end) or from
// what an ended stream left here. A worker that reconnects to another
// gateway cannot report those tasks; they run again once their lease ends.

// owner names who may adopt what a stream holds.
func (s *session) owner() string { return workerKey(s.namespace, s.workerID) + "/" + s.keyID }

// ownsTask says whether the session may report the attempt of task id,
// adopting it from another stream of its worker when that one holds it.
func (s *session) ownsTask(id string, attempt int32) bool {
	return s.owns(func(o *session) *untilSet { return &o.held.untilSet }, &s.srv.left.tasks, attemptKey(id, attempt))
}

// ownsRecord says whether the session may settle a record, adopting it like
// ownsTask.
func (s *session) ownsRecord(stream, group, id string) bool {
	return s.owns(func(o *session) *untilSet { return &o.records.untilSet }, &s.srv.left.records, recordKey(stream, group, id))
}

// owns says whether id is in the session's set that set picks, adopting it
// into that set from another stream of the worker or from left.
func (s *session) owns(set func(*session) *untilSet, left *owned, id string) bool {
	mine := set(s)
	if mine.has(id) {
		return true
	}
	until, ok := s.srv.adopt(s, set, left, id)
	if ok {
		mine.put(id, until)
	}
	return ok
}

// adopt takes id from another open stream of sess's worker or from what an
// ended one left.
func (s *Server) adopt(sess *session, set func(*session) *untilSet, left *owned, id string) (time.Time, bool) {
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	for other := range s.sessions[workerKey(sess.namespace, sess.workerID)] {
		if other == sess || other.keyID != sess.keyID {
			continue
		}
		if until, ok := set(other).take(id); ok {
			return until, true
		}
	}
	return s.left.take(left, sess.owner(), id, time.Now())
}

// retire forgets an ended session, keeping what it still holds for its
// worker's next stream. Both happen under sessionsMu, so an adopting stream
// finds each task either in the session or in the leftovers.
func (s *Server) retire(sess *session) {
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	s.left.keep(sess.owner(), sess.held.takeAll(), sess.records.takeAll(), time.Now())
	s.untrackLocked(sess)
}

// owned is one kind of leftovers: owner -> id -> time, kept grace past it.
type owned struct {
	grace   time.Duration
	byOwner map[string]map[string]time.Time
}

// leftovers are what ended streams held, by owner, for the owner's next
// stream: task ids with their lease end (kept leaseGrace longer), and record
// keys with when they stop counting.
type leftovers struct {
	mu      sync.Mutex
	n       int
	tasks   owned
	records owned
}

func newLeftovers() *leftovers {
	return &leftovers{
		tasks:   owned{grace: leaseGrace, byOwner: make(map[string]map[string]time.Time)},
		records: owned{byOwner: make(map[string]map[string]time.Time)},
	}
}

// keep stores what an ended session held.
func (l *leftovers) keep(owner string, tasks, records map[string]time.Time, now time.Time) {
	if len(tasks) == 0 && len(records) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	l.add(&l.tasks, owner, tasks)
	l.add(&l.records, owner, records)
}

func (l *leftovers) add(kind *owned, owner string, ids map[string]time.Time) {
	for id, until := range ids {
		if l.n >= maxHandover {
			return
		}
		set := kind.byOwner[owner]
		if set == nil {
			set = make(map[string]time.Time)
			kind.byOwner[owner] = set
		}
		if _, dup := set[id]; !dup {
			l.n++
		}
		set[id] = until
	}
}

// take removes id from the owner's leftovers of one kind and returns its
// time, unless that has passed.
func (l *leftovers) take(kind *owned, owner, id string, now time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	set := kind.byOwner[owner]
	until, ok := set[id]
	if !ok {
		return time.Time{}, false
	}
	delete(set, id)
	l.n--
	if len(set) == 0 {
		delete(kind.byOwner, owner)
	}
	return until, !now.After(until.Add(kind.grace))
}

// sweep drops leftovers whose time has passed.
func (l *leftovers) sweep(now time.Time) {
	for _, kind := range []*owned{&l.tasks, &l.records} {
		for owner, set := range kind.byOwner {
			for id, until := range set {
				if now.After(until.Add(kind.grace)) {
					delete(set, id)
					l.n--
				}
			}
			if len(set) == 0 {
				delete(kind.byOwner, owner)
			}
		}
	}
}
