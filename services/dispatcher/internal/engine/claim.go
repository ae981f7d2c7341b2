package engine

import (
	"cmp"
	"crypto/rand"
	"slices"
	"time"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// Slot is room for one task in a claim.
type Slot struct {
	WorkerID string
	// Lease is the lease length; zero means the task's own timeout.
	Lease time.Duration
}

// Claimed is a task a claim moved to running, and the slot it went to.
type Claimed struct {
	// Task is the task as the claim left it: the Task of the claim's
	// Started change, shared rather than copied again (a claim's tasks are
	// copied from partition to caller to merged answer). The caller owns it
	// once Claim returns.
	Task *Task
	Slot int
}

// Ready counts the tasks of ns/action claimable at now (queued, run_at <= now).
func (p *Partition) Ready(ns, action string, now time.Time) int {
	p.advance(now)
	h, ok := p.ready[queueKey{ns, action}]
	if !ok {
		return 0
	}
	return h.live
}

// Level is how many claimable tasks of a queue have one priority.
type Level struct {
	Priority int32
	Count    int
}

// ReadyLevels counts the tasks of ns/action claimable at now by priority,
// highest first; nil when there are none.
func (p *Partition) ReadyLevels(ns, action string, now time.Time) []Level {
	p.advance(now)
	h, ok := p.ready[queueKey{ns, action}]
	if !ok || h.live == 0 {
		return nil
	}
	out := make([]Level, 0, len(h.levels))
	for prio, n := range h.levels {
		out = append(out, Level{Priority: prio, Count: n})
	}
	slices.SortFunc(out, func(a, b Level) int { return cmp.Compare(b.Priority, a.Priority) })
	return out
}

// ReadyFrom is how many tasks of ns among actions are claimable at now with
// priority floor or higher.
func (p *Partition) ReadyFrom(ns string, actions []string, floor int32, now time.Time) int {
	p.advance(now)
	n := 0
	for _, a := range actions {
		if h, ok := p.ready[queueKey{ns, a}]; ok {
			for prio, c := range h.levels {
				if prio >= floor {
					n += c
				}
			}
		}
	}
	return n
}

// Actions lists, as store.Key names, the actions with tasks claimable at now,
// for serving the claims that wait on them.
func (p *Partition) Actions(now time.Time) []string {
	p.advance(now)
	var out []string
	for k, h := range p.ready {
		if h.live > 0 {
			out = append(out, store.Key(k.namespace, k.action))
		}
	}
	return out
}

// maxClaimActions is how many actions a claim merges without allocating.
const maxClaimActions = 8

// Claim leases up to len(slots) ready tasks of ns among actions, taken in
// hand-out order across the actions (priority DESC, run_at, created_at):
// slot i gets the i-th task, as its next attempt, running on the slot's
// worker until now plus the slot's lease (zero: the task's timeout), with a
// new completion secret. Each claimed task is a Started change.
func (p *Partition) Claim(ns string, actions []string, slots []Slot, now time.Time) ([]Claimed, []Change) {
	if len(slots) == 0 {
		return nil, nil
	}
	p.advance(now)
	var buf [maxClaimActions]*heap
	queues := buf[:0]
	live := 0
	for _, a := range actions {
		if h, ok := p.ready[queueKey{ns, a}]; ok && h.live > 0 {
			queues = append(queues, h)
			live += h.live
		}
	}
	if len(queues) == 0 {
		return nil, nil
	}
	var (
		claimed []Claimed
		changes []Change
		secrets []byte
	)
	for i, slot := range slots {
		var best *heap
		var bestTop *item
		for _, h := range queues {
			if top := h.top(); top != nil && (bestTop == nil || handOut(top, bestTop)) {
				best, bestTop = h, top
			}
		}
		if best == nil {
			break
		}
		if secrets == nil {
			// One read for the whole claim: the secrets share its array.
			// A claim offers more slots than there are ready tasks as
			// often as not; what it can take sizes the arrays.
			n := min(len(slots), live)
			secrets = make([]byte, secretBytes*n)
			_, _ = rand.Read(secrets) // crypto/rand.Read never fails
			claimed = make([]Claimed, 0, n)
			changes = make([]Change, 0, n)
		}
		e := take(best)
		t := e.t
		lease := slot.Lease
		if lease <= 0 {
			lease = t.Settings.Timeout
		}
		t.Status, t.Attempt, t.WorkerID = store.Running, t.Attempt+1, slot.WorkerID
		t.LeaseUntil, t.StartedAt, t.UpdatedAt = now.Add(lease), now, now
		t.CompletionSecret = secrets[i*secretBytes : (i+1)*secretBytes : (i+1)*secretBytes]
		p.put(e, t)
		// changes has room for every task the claim can take, so the
		// pointer stays valid.
		changes = append(changes, Change{Type: taskevent.Started, Task: t}.madeTo(e))
		claimed = append(claimed, Claimed{Task: &changes[len(changes)-1].Task, Slot: i})
	}
	return claimed, changes
}
