package roster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/registry/internal/store"
	"github.com/razorbill/flo/services/registry/internal/workerevent"
)

// registration is a checked registration; generated says its id was made
// up, so it must be a new worker, never a replacement.
type registration struct {
	store.Registration
	generated bool
}

type (
	registrationCall = coalesce.Call[registration, store.Worker]
	heartbeatCall    = coalesce.Call[store.Beat, store.Status]
)

var (
	registrationKind = metric.WithAttributes(attribute.String("kind", "registration"))
	heartbeatKind    = metric.WithAttributes(attribute.String("kind", "heartbeat"))
)

// execHeartbeats writes the heartbeats that arrived together in one
// transaction: one statement for the load, time and status of every worker
// due a write (store.Heartbeats), and one outbox row holding the
// STATUS_CHANGED events of the workers whose status changed. Each caller is answered after the commit with its
// worker's status, or NotFound for a worker that is not registered. Two
// heartbeats of one worker in a batch are written as the later one, and both
// get its status.
func (r *Roster) execHeartbeats(ctx context.Context, calls []*heartbeatCall) error {
	r.batchSize.Record(ctx, int64(len(calls)), heartbeatKind)
	// pos is where a worker's beat is in beats, latest the index of its
	// latest call.
	pos := make(map[store.Key]int, len(calls))
	latest := make(map[store.Key]int, len(calls))
	beats := make([]store.Beat, 0, len(calls))
	for i, c := range calls {
		k := c.Req.Key()
		if p, ok := pos[k]; ok {
			beats[p] = c.Req
		} else {
			pos[k] = len(beats)
			beats = append(beats, c.Req)
		}
		latest[k] = i
	}
	var changes []store.Change
	err := pg.InBatchTx(ctx, r.pool, func(tx *pg.BatchTx) error {
		var err error
		if changes, err = store.Heartbeats(ctx, tx, beats, r.fresh); err != nil {
			return err
		}
		var records []outbox.Record
		at := time.Now()
		for _, ch := range changes {
			if ch.From == ch.To {
				continue
			}
			rec, err := workerevent.Record(workerevent.StatusChanged, ch, at)
			if err != nil {
				return err
			}
			// The trace goes on from the heartbeat that made the change.
			rec.Headers = kafka.TraceHeaders(calls[latest[ch.Key()]].Ctx)
			records = append(records, rec)
		}
		return store.Commit(ctx, tx, records)
	})
	if err != nil {
		return batchError("record heartbeats", err)
	}
	status := make(map[store.Key]store.Status, len(changes))
	notify := false
	for _, ch := range changes {
		status[ch.Key()] = ch.To
		notify = notify || ch.From != ch.To
	}
	recorded := 0
	for _, c := range calls {
		st, ok := status[c.Req.Key()]
		if !ok {
			c.Err = notFound(c.Req.Namespace, c.Req.ID)
			continue
		}
		c.Resp = st
		recorded++
	}
	r.beats.Add(ctx, int64(recorded))
	if notify {
		r.relay.Notify()
	}
	return nil
}

// execRegistrations writes the registrations that arrived together in one
// transaction. Postgres refusing one of them (metadata jsonb will not
// take, say) would fail them all, so then each is tried again alone and
// only that one fails.
func (r *Roster) execRegistrations(ctx context.Context, calls []*registrationCall) error {
	r.batchSize.Record(ctx, int64(len(calls)), registrationKind)
	err := r.registerBatch(ctx, calls)
	if err == nil || len(calls) == 1 || errors.Is(err, ErrUnavailable) {
		return err
	}
	for i := range calls {
		if err := r.registerBatch(ctx, calls[i:i+1]); err != nil {
			calls[i].Err = err
		}
	}
	return nil
}

// registerBatch admits calls in arrival order under the locks of their
// namespaces: each namespace's workers are counted once, a registration of
// a worker that is not registered yet takes one place, and one that finds
// no place left is refused with Exhausted. Ids made up here are redrawn
// until free. The admitted ones are written in rounds, so a worker
// registered twice in a batch is written twice, in order, and then one
// outbox row holds every REGISTERED event. Callers get their answers only
// once it all committed; on an error nothing was written and no call was
// answered.
func (r *Roster) registerBatch(ctx context.Context, calls []*registrationCall) error {
	regs := make([]registration, len(calls))
	namespaces := make([]string, len(calls))
	keys := make([]store.Key, len(calls))
	for i, c := range calls {
		regs[i] = c.Req
		namespaces[i], keys[i] = c.Req.Namespace, c.Req.Key()
	}
	var (
		workers  = make([]store.Worker, len(calls))
		refusals = make([]error, len(calls))
		admitted int
	)
	err := pg.InBatchTx(ctx, r.pool, func(tx *pg.BatchTx) error {
		occ, err := store.Occupy(ctx, tx, namespaces, keys)
		if err != nil {
			return err
		}
		if err := freeIDs(ctx, tx, regs, occ.Statuses); err != nil {
			return err
		}
		rounds, prevs := r.admit(regs, occ, refusals)
		for _, round := range rounds {
			batch := make([]store.Registration, len(round))
			replaced := make([]bool, len(round))
			for j, i := range round {
				batch[j], replaced[j] = regs[i].Registration, prevs[i] != ""
			}
			ws, err := store.PutWorkers(ctx, tx, batch, replaced)
			if err != nil {
				return err
			}
			for j, i := range round {
				workers[i] = ws[j]
			}
		}
		var records []outbox.Record
		at := time.Now()
		for i, reg := range regs {
			if refusals[i] != nil {
				continue
			}
			rec, err := workerevent.Record(workerevent.Registered, store.Change{
				Namespace: reg.Namespace, WorkerID: reg.ID, From: prevs[i], To: workers[i].Status,
			}, at)
			if err != nil {
				return err
			}
			rec.Headers = kafka.TraceHeaders(calls[i].Ctx)
			records = append(records, rec)
		}
		admitted = len(records)
		return store.Commit(ctx, tx, records)
	})
	if err != nil {
		return batchError("register workers", err)
	}
	for i, c := range calls {
		c.Resp, c.Err = workers[i], refusals[i]
	}
	if admitted > 0 {
		r.relay.Notify()
		r.registered.Add(ctx, int64(admitted))
	}
	return nil
}

// admit decides, in order, which registrations get in. It returns the
// admitted ones as rounds of distinct workers (a worker's n-th
// registration in the batch is in round n) and the status each replaced
// ("" for a new worker), and sets refusals[i] for each one refused.
func (r *Roster) admit(regs []registration, occ store.Occupancy, refusals []error) (rounds [][]int, prevs []store.Status) {
	prevs = make([]store.Status, len(regs))
	count, status := occ.Counts, occ.Statuses
	written := make(map[store.Key]int, len(regs))
	for i, reg := range regs {
		k := reg.Key()
		prev, found := status[k]
		if !found {
			if count[reg.Namespace] >= r.maxWorkers {
				refusals[i] = fault.Exhaustedf("namespace %s has %d workers, the limit is %d", reg.Namespace, count[reg.Namespace], r.maxWorkers)
				continue
			}
			count[reg.Namespace]++
		}
		prevs[i], status[k] = prev, store.Active
		n := written[k]
		written[k]++
		if n == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[n] = append(rounds[n], i)
	}
	return rounds, prevs
}

// freeIDs redraws each made-up id that is registered already or used by
// another registration of the batch, until every one is free.
func freeIDs(ctx context.Context, db store.DB, regs []registration, statuses map[store.Key]store.Status) error {
	for attempt := 1; ; attempt++ {
		uses := make(map[store.Key]int, len(regs))
		for _, reg := range regs {
			uses[reg.Key()]++
		}
		var taken []int
		for i, reg := range regs {
			if _, registered := statuses[reg.Key()]; reg.generated && (registered || uses[reg.Key()] > 1) {
				taken = append(taken, i)
			}
		}
		if len(taken) == 0 {
			return nil
		}
		if attempt == idAttempts {
			return fmt.Errorf("make up free worker ids: %d tries taken", attempt)
		}
		redrawn := make([]store.Key, len(taken))
		for j, i := range taken {
			regs[i].ID = newWorkerID()
			redrawn[j] = regs[i].Key()
		}
		found, err := store.Statuses(ctx, db, redrawn)
		if err != nil {
			return err
		}
		for k, s := range found {
			statuses[k] = s
		}
	}
}

// batchError says what a failed batch was doing; a failure that is not the
// callers' becomes ErrUnavailable and metadata Postgres refused becomes
// Invalid.
func batchError(what string, err error) error {
	switch {
	case errors.Is(err, store.ErrBadMetadata):
		return fault.Invalidf("metadata: %v", err)
	case kafka.IsTransient(err):
		return fmt.Errorf("%s: %w: %w", what, ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
