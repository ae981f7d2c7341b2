package group

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/razorbill/flo/services/streams/internal/record"
	"github.com/razorbill/flo/services/streams/internal/store"
)

// readCall is one group read waiting for a transaction of its group.
type readCall struct {
	ctx context.Context
	req ReadRequest
	// probed says the hub's safety probe woke the read: it looks, whatever
	// the group's last look found.
	probed bool
	recs   []record.Record
	// due is the group's when it got no records and may wait.
	due  store.Due
	err  error
	done chan struct{}
}

// readQueue holds the reads of one group waiting for a transaction while
// another runs. Reads of one group on one replica never wait on each
// other's locks: each transaction serves every read that was waiting when it
// began.
type readQueue struct {
	grp     store.GroupOf
	waiting []*readCall
}

// look hands records to the consumers of reqs in a transaction shared
// with the group's other reads that wait at the same time; with none, it
// returns the group's Due for blocked reads to wait by. A blocked read that
// is not probed is answered without a transaction while the group's last
// look holds. Reads are dropped when ctx ends before a transaction took
// them; those a transaction took are waited for, since records may
// already be handed to their consumers, and their records returned.
func (g *Groups) look(ctx context.Context, grp store.GroupOf, reqs []ReadRequest, probed bool) ([][]record.Record, store.Due, error) {
	calls := make([]*readCall, len(reqs))
	for i, req := range reqs {
		// One probed read is enough: what it finds, the others would.
		calls[i] = &readCall{ctx: ctx, req: req, probed: probed && i == 0, done: make(chan struct{})}
	}
	g.readMu.Lock()
	q := g.reads[grp.Group.ID]
	if q == nil {
		q = &readQueue{grp: grp}
		g.reads[grp.Group.ID] = q
		go g.serveReads(q)
	}
	q.waiting = append(q.waiting, calls...)
	g.readMu.Unlock()

	var ended error
	for _, c := range calls {
		select {
		case <-c.done:
			continue
		case <-ctx.Done():
		}
		ended = ctx.Err()
		break
	}
	if ended != nil {
		mine := make(map[*readCall]bool, len(calls))
		for _, c := range calls {
			mine[c] = true
		}
		g.readMu.Lock()
		q.waiting = slices.DeleteFunc(q.waiting, func(w *readCall) bool {
			if !mine[w] {
				return false
			}
			w.err = ended
			close(w.done)
			return true
		})
		g.readMu.Unlock()
	}
	recs := make([][]record.Record, len(calls))
	var (
		due store.Due
		err error
		got bool
	)
	for i, c := range calls {
		<-c.done
		recs[i] = c.recs
		got = got || len(c.recs) > 0
		if c.err != nil {
			err = cmp.Or(err, c.err)
			continue
		}
		due = c.due
	}
	switch {
	case got:
		// Records handed out are returned, whatever became of the others.
		return recs, due, nil
	case err != nil:
		return nil, store.Due{}, err
	}
	return recs, due, nil
}

// serveReads runs read transactions for q's group while reads wait, each
// for all of them (up to maxBatchReads), and then forgets the queue. A
// transaction runs in the context of its first read, without its end: the
// others may still want their records.
func (g *Groups) serveReads(q *readQueue) {
	for {
		g.readMu.Lock()
		n := min(len(q.waiting), maxBatchReads)
		if n == 0 {
			delete(g.reads, q.grp.Group.ID)
			g.readMu.Unlock()
			return
		}
		calls := slices.Clone(q.waiting[:n])
		q.waiting = slices.Delete(q.waiting, 0, n)
		g.readMu.Unlock()

		id := q.grp.Group.ID
		stamp := g.hub.Stamp(GroupKey(id), q.grp.Stream.Topic())
		if calls = g.answerQuiet(id, stamp, calls); len(calls) == 0 {
			continue
		}
		changes := g.quiet.before(id)
		txCtx, cancel := context.WithTimeout(context.WithoutCancel(calls[0].ctx), readTxTimeout)
		err := g.readBatch(txCtx, q.grp, calls)
		if err == nil {
			if due, waiting := g.dueFor(txCtx, q.grp, calls); waiting && holderLooked(q.grp, calls, due) {
				g.quiet.found(id, changes, stamp, due)
			}
		}
		cancel()
		for _, c := range calls {
			if err != nil {
				c.recs, c.err = nil, err
			}
			close(c.done)
		}
	}
}

// holderLooked says whether calls, which found nothing, speak for every
// consumer of the group: in an exclusive group only when the lease holder
// was among them, since the others get nothing anyway.
func holderLooked(grp store.GroupOf, calls []*readCall, due store.Due) bool {
	if grp.Group.Mode != store.ModeExclusive {
		return true
	}
	return slices.ContainsFunc(calls, func(c *readCall) bool { return c.req.Consumer == due.Owner })
}

// answerQuiet answers the blocked, unprobed calls of the group with nothing
// while its last look holds at stamp, and returns the other calls.
func (g *Groups) answerQuiet(groupID int64, stamp uint64, calls []*readCall) []*readCall {
	due, ok := g.quiet.still(groupID, stamp, time.Now())
	if !ok {
		return calls
	}
	rest := calls[:0]
	for _, c := range calls {
		if c.req.Block <= 0 || c.probed {
			rest = append(rest, c)
			continue
		}
		c.recs, c.due = c.recs[:0], due
		close(c.done)
	}
	return rest
}

// dueFor reads the group's Due once for the blocked calls that got no
// records, which wait by it; failing, it is their error. It returns the Due
// and whether it read it successfully.
func (g *Groups) dueFor(ctx context.Context, grp store.GroupOf, calls []*readCall) (store.Due, bool) {
	var waiting []*readCall
	for _, c := range calls {
		if len(c.recs) == 0 && c.req.Block > 0 {
			waiting = append(waiting, c)
		}
	}
	if len(waiting) == 0 {
		return store.Due{}, false
	}
	due, err := store.GroupDue(ctx, g.pool, grp.Group.ID)
	for _, c := range waiting {
		c.due, c.err = due, err
	}
	return due, err == nil
}
