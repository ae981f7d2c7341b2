package flo

import (
	"slices"
	"sync"
)

// slots counts the handler slots in use and the credit the server holds for the worker.
//
// Each Ready grants the server credit for count tasks until its block timeout. The server uses
// grants oldest first as it hands out tasks, and answers each grant that expires with credit
// left by one empty TaskBatch. The worker sees those messages in the order the server did its
// bookkeeping, so it keeps the same books here and asks only for slots that are neither
// running a task nor already promised one: the server then never sends more than the worker
// can start.
//
// A stream worker keeps the same books with one difference: its credit is in reads, each
// answered by exactly one RecordBatch (see grantRead and answer).
type slots struct {
	mu       sync.Mutex
	size     int
	inFlight int
	// grants holds what is left of each Ready's credit, oldest first (for a stream worker: the
	// records of an answered read that have not taken a slot yet); credit is their sum plus
	// the counts in reads.
	grants []int
	credit int
	// reads holds the counts of a stream worker's outstanding reads.
	reads []int
}

// reset forgets the credit of a stream that ended: it died with the stream.
func (s *slots) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.grants, s.reads, s.credit = nil, nil, 0
}

// grant records a Ready for every free slot and returns its count; zero means there is
// nothing to ask for.
func (s *slots) grant() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.size - s.inFlight - s.credit
	if n <= 0 {
		return 0
	}
	s.grants = append(s.grants, n)
	s.credit += n
	return n
}

// grantRead is grant for a stream worker, which keeps up to maxReads reads outstanding. It
// records a read for the free slots, at most limit, and returns its count; zero means there is
// nothing to ask for: no free slot, maxReads reads outstanding, records of an answered read
// still waiting for slots, or a read outstanding and room for less than limit (a read beyond
// the first asks for a full batch, so the slots are not cut into many small reads).
func (s *slots) grantRead(limit, maxReads int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.grants) > 0 || len(s.reads) >= maxReads {
		return 0
	}
	n := min(limit, s.size-s.inFlight-s.credit)
	if n <= 0 || (len(s.reads) > 0 && n < limit) {
		return 0
	}
	s.reads = append(s.reads, n)
	s.credit += n
	return n
}

// answer records a RecordBatch of n records, the answer to one outstanding read. The server
// answers reads in any order, so which one is not known when their counts differ: the
// smallest is taken as answered, which never leaves less credit than the server may still use.
// The n records are credit until each has taken a slot (acquire) or been handed back
// (consume), and the next read waits until they all have.
func (s *slots) answer(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reads) > 0 {
		i := slices.Index(s.reads, slices.Min(s.reads))
		s.credit -= s.reads[i]
		s.reads = slices.Delete(s.reads, i, i+1)
	}
	if n > 0 {
		s.grants = append(s.grants, n)
		s.credit += n
	}
}

// consume records that one task arrived.
func (s *slots) consume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.consumeLocked()
}

func (s *slots) consumeLocked() {
	if len(s.grants) == 0 {
		return
	}
	s.credit--
	s.grants[0]--
	if s.grants[0] == 0 {
		s.grants = s.grants[1:]
	}
}

// expire records an empty TaskBatch: the oldest grant ran out of time, and its credit is free
// to ask for again.
func (s *slots) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.grants) == 0 {
		return
	}
	s.credit -= s.grants[0]
	s.grants = s.grants[1:]
}

// acquire takes a slot for a task that arrived, consuming its credit, and reports false when
// every slot is busy.
func (s *slots) acquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight >= s.size {
		return false
	}
	s.inFlight++
	s.consumeLocked()
	return true
}

// release frees the slot of a task whose handler returned.
func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
}

// running returns how many handlers are running.
func (s *slots) running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight
}
