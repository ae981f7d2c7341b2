// Package tally counts what workers did from the task events on
// flo.tasks.outcomes: completions and failures per worker and per process. One
// transaction takes the batches of a poll's partitions together: it locks
// each partition's next offset (table tally_offsets), applies only the
// records at or past it, aggregated into one statement for workers and one
// for processes, and moves the offset past the batch, so a redelivered
// record changes nothing and no row is written per event.
package tally

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/protopeek"
	"github.com/razorbill/flo/libs/text"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	"github.com/razorbill/flo/services/registry/internal/store"
)

// The tally's fetches wait up to FetchMaxWait for FetchMinBytes of events:
// counts may trail by that much, and under load each fetch, and each
// transaction, takes thousands of events instead of a few.
const (
	FetchMinBytes = 1 << 20
	FetchMaxWait  = 200 * time.Millisecond
)

// ConsumerGroup is the registry's consumer group on kafka.TaskOutcomesTopic.
const ConsumerGroup = "flo-registry"

// txTimeout bounds a batch's transaction, statements and idle time between
// them: a replica paused mid-batch holds its partition's offset row and
// worker rows no longer, so the partition's new owner is not stalled behind
// it.
const txTimeout = 30 * time.Second

// Outcome is what a task event says about the worker that ran the attempt.
type Outcome int

// Outcomes.
const (
	// Ignored: the event says nothing about how an attempt ended.
	Ignored Outcome = iota
	// Succeeded: the attempt completed.
	Succeeded
	// Failed: the attempt failed, whether it will be retried or not.
	Failed
)

// OutcomeOf classifies an event type. A scheduled retry is a failed attempt;
// dead-lettering ends one too. Abandons and requeues are not the worker's
// doing. A lease expiry on its own is not counted either: when it used the
// last attempt the dispatcher also emits DEAD_LETTERED, which is.
func OutcomeOf(t eventsv1.TaskEventType) Outcome {
	switch t {
	case eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED:
		return Succeeded
	case eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_RETRY_SCHEDULED,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED:
		return Failed
	default:
		return Ignored
	}
}

// Event is the part of a task event the tally uses, with the offset of its
// record.
type Event struct {
	Offset     int64
	Outcome    Outcome
	Namespace  string
	WorkerID   string
	Action     string
	OccurredAt time.Time
}

// Tally applies task events to worker and process counters.
type Tally struct {
	pool    *pgxpool.Pool
	applied metric.Int64Counter
	// batches gathers the partitions' batches of a poll, which the consumer
	// hands over at once, into one transaction.
	batches *coalesce.Batcher[batch, struct{}]
}

// batch is the events of a partition's polled records to count, and the
// offset after the last record.
type batch struct {
	topic     string
	partition int32
	events    []Event
	next      int64
}

// The most batches one transaction takes, and how many more may wait.
const (
	maxBatches    = 64
	queuedBatches = 256
)

// New returns a Tally. Run applies what HandleRecords hands it.
func New(pool *pgxpool.Pool, meter metric.Meter) (*Tally, error) {
	applied, err := meter.Int64Counter("flo.registry.task_events.applied", metric.WithUnit("{event}"), metric.WithDescription("Task events counted for a worker."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	t := &Tally{pool: pool, applied: applied}
	t.batches = coalesce.New(queuedBatches, maxBatches, t.execBatches)
	return t, nil
}

// Run applies the batches HandleRecords hands over until ctx ends; run it
// while the consumer runs, and stop it after.
func (t *Tally) Run(ctx context.Context) error { return t.batches.Run(ctx) }

// HandleRecords is the kafka.BatchHandler for Topic: records of one
// partition in offset order. A record that does not decode, or names a worker
// or namespace no store could hold, is returned as kafka.Poison once the
// others are counted (the consumer dead-letters it); the stored offset passes
// it like any other.
func (t *Tally) HandleRecords(ctx context.Context, records []*kgo.Record) error {
	b, poison := batchOf(records)
	// Nothing to count is nothing a redelivery could count twice: the
	// offset moves with the next batch that counts something.
	if len(b.events) > 0 {
		var err error
		if kafka.Isolated(ctx) {
			// On its own, so that another partition's failure cannot
			// fail it again (see the workflow runner's HandleTaskEvents).
			err = t.apply(ctx, []batch{b})
		} else {
			_, err = t.batches.Do(ctx, b)
		}
		if err != nil {
			return err
		}
	}
	return errors.Join(poison...)
}

// batchOf is the batch of a partition's records, and the kafka.Poison of
// each that cannot be counted.
func batchOf(records []*kgo.Record) (batch, []error) {
	if len(records) == 0 {
		return batch{}, nil
	}
	// Outcomes that end no attempt (waiting, rejected) count for no one:
	// they are skipped by their type alone, without a decode, and the list
	// is sized for the others.
	counted := 0
	for _, r := range records {
		if !ignored(r) {
			counted++
		}
	}
	first, last := records[0], records[len(records)-1]
	b := batch{topic: first.Topic, partition: first.Partition, events: make([]Event, 0, counted), next: last.Offset + 1}
	var poison []error
	for _, r := range records {
		if ignored(r) {
			continue
		}
		e, err := decode(r)
		if err != nil {
			poison = append(poison, kafka.Poison(r, err))
			continue
		}
		// Without a worker there is no one to count for.
		if e.Outcome != Ignored && e.WorkerID != "" && e.Namespace != "" {
			b.events = append(b.events, e)
		}
	}
	return b, poison
}

// execBatches applies the batches of the calls the Batcher gathered.
func (t *Tally) execBatches(ctx context.Context, calls []*coalesce.Call[batch, struct{}]) error {
	batches := make([]batch, len(calls))
	for i, c := range calls {
		batches[i] = c.Req
	}
	return t.apply(ctx, batches)
}

// typeNumber is the number of TaskEvent's type field.
var typeNumber = (&eventsv1.TaskEvent{}).ProtoReflect().Descriptor().Fields().ByName("type").Number()

// ignored reports whether r's event type alone says it counts for no one; a
// record whose type cannot be read is decoded, to be counted or refused.
func ignored(r *kgo.Record) bool {
	typ, ok := protopeek.Varint(r.Value, typeNumber)
	return ok && OutcomeOf(eventsv1.TaskEventType(typ)) == Ignored
}

func decode(r *kgo.Record) (Event, error) {
	var ev eventsv1.TaskEvent
	// Only the dispatcher writes task events; the names are checked below.
	if err := ev.UnmarshalVT(r.Value); err != nil {
		return Event{}, fmt.Errorf("decode TaskEvent: %w", err)
	}
	e := Event{
		Offset: r.Offset, Outcome: OutcomeOf(ev.GetType()), Namespace: ev.GetNamespace(),
		WorkerID: ev.GetWorkerId(), Action: ev.GetAction(), OccurredAt: ev.GetOccurredAt().AsTime(),
	}
	if ev.GetOccurredAt() == nil {
		e.OccurredAt = r.Timestamp
	}
	for _, f := range []struct{ name, v string }{{"namespace", e.Namespace}, {"worker_id", e.WorkerID}, {"action", e.Action}} {
		if err := text.Storable(f.name, f.v); err != nil {
			return Event{}, fmt.Errorf("task event: %w", err)
		}
	}
	return e, nil
}

// apply counts, in one transaction, the events of batches (each about a
// worker's attempt) at or past their partitions' stored next offsets, and
// moves each offset forward to its batch's next. The offset rows are locked
// first, in one order, so batches another replica is applying (a rebalance
// overlap) or applied (a redelivery) are counted once and two replicas do
// not deadlock.
func (t *Tally) apply(ctx context.Context, batches []batch) error {
	slices.SortStableFunc(batches, func(a, b batch) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	total := 0
	for _, b := range batches {
		total += len(b.events)
	}
	counted := make([]Event, 0, total)
	err := pg.InTx(ctx, t.pool, func(tx pgx.Tx) error {
		counted = counted[:0]
		if err := pg.BoundTx(ctx, tx, txTimeout); err != nil {
			return err
		}
		for _, b := range batches {
			from, err := store.LockTallyOffset(ctx, tx, b.topic, b.partition)
			if err != nil {
				return err
			}
			if b.next <= from {
				continue // applied before, all of it
			}
			// Records come in offset order: those applied before are a
			// prefix.
			skip := 0
			for skip < len(b.events) && b.events[skip].Offset < from {
				skip++
			}
			counted = append(counted, b.events[skip:]...)
			if err := store.SetTallyOffset(ctx, tx, b.topic, b.partition, b.next); err != nil {
				return err
			}
		}
		workers, processes := Aggregate(counted)
		if err := store.AddWorkerCounts(ctx, tx, workers); err != nil {
			return err
		}
		return store.AddProcessCounts(ctx, tx, processes)
	})
	if err != nil {
		return fmt.Errorf("count the task events of %d partition batches: %w", len(batches), err)
	}
	t.applied.Add(ctx, int64(len(counted)))
	return nil
}

// Aggregate sums events per worker and per worker process, sorted by key.
func Aggregate(events []Event) ([]store.WorkerCount, []store.ProcessCount) {
	type workerKey struct{ ns, id string }
	type processKey struct{ ns, id, name string }
	workers := map[workerKey]*store.WorkerCount{}
	processes := map[processKey]*store.ProcessCount{}
	for _, e := range events {
		wk := workerKey{e.Namespace, e.WorkerID}
		w := workers[wk]
		if w == nil {
			w = &store.WorkerCount{Namespace: e.Namespace, WorkerID: e.WorkerID}
			workers[wk] = w
		}
		var p *store.ProcessCount
		if e.Action != "" {
			pk := processKey{e.Namespace, e.WorkerID, e.Action}
			if p = processes[pk]; p == nil {
				p = &store.ProcessCount{Namespace: e.Namespace, WorkerID: e.WorkerID, Name: e.Action}
				processes[pk] = p
			}
			if e.OccurredAt.After(p.LastRunAt) {
				p.LastRunAt = e.OccurredAt
			}
		}
		switch e.Outcome {
		case Succeeded:
			w.Completed++
			if p != nil {
				p.Runs++
			}
		case Failed:
			w.Failed++
			if p != nil {
				p.Fails++
			}
		}
	}
	ws := make([]store.WorkerCount, 0, len(workers))
	for _, w := range workers {
		ws = append(ws, *w)
	}
	slices.SortFunc(ws, func(a, b store.WorkerCount) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.WorkerID, b.WorkerID))
	})
	ps := make([]store.ProcessCount, 0, len(processes))
	for _, p := range processes {
		ps = append(ps, *p)
	}
	slices.SortFunc(ps, func(a, b store.ProcessCount) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.Name, b.Name))
	})
	return ws, ps
}
