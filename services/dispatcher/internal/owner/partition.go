package owner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/retry"
	"github.com/razorbill/flo/services/dispatcher/internal/catalog"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
	"github.com/razorbill/flo/services/dispatcher/internal/view"
)

// Batch bounds: one transaction takes at most this many commands and
// calls, so a flood of one kind cannot starve the other of latency.
const (
	maxBatchCommands = 5000
	maxBatchOps      = 1000
	opQueue          = 4096
)

// replayStall bounds how long a rebuild's read of the log may go without a
// record before it starts over.
const replayStall = 30 * time.Second

// hintEvery spaces a partition's group offset commits.
const hintEvery = time.Second

// errFenced says another replica took the partition over: its producer
// bumped the transactional epoch, so nothing this replica writes for the
// partition can commit any more.
var errFenced = errors.New("partition taken over by another replica")

// intakeRetry paces applying commands again after it failed.
var intakeRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// rebuildRetry paces rebuild attempts while the broker or Postgres is down.
var rebuildRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// op is a call applied by a partition's goroutine: apply changes the engine
// and returns what must be recorded; done answers the caller once the
// records are committed (err nil) or could not be (err set).
type op interface {
	// apply applies the op to the partition's engine and appends the
	// changes it made to changes.
	apply(p *partition, now time.Time, changes []engine.Change) []engine.Change
	done(err error)
}

// partition runs one owned partition: a single goroutine applies commands,
// calls and timers to its engine.Partition and records every change on the
// events partition in one Kafka transaction per batch.
type partition struct {
	r   *Replica
	id  int32
	log *slog.Logger
	// txn is the producer of the partition's transactions, made by newTxn
	// before each rebuild and dropped after any failure (see dropTxn).
	txn    *producer
	newTxn func() (*producer, error)

	ops chan op

	cmdMu     sync.Mutex
	cmds      []*kgo.Record
	cmdSignal chan struct{}

	// materialized is the last events offset the view holds; -1 until the
	// materializer says.
	materialized atomic.Int64
	matSignal    chan struct{}
	// snapshotViewed is the last events offset the view held in the
	// snapshot of the last rebuild (see current). It is kept apart from
	// materialized, which also lets tasks go cold (Materialized): set there,
	// it had a rebuilt partition let tasks go before its first flush, under
	// a claim shared out on the levels the rebuild had just set, and the
	// claim took a lower priority than the replica held.
	snapshotViewed int64
	// payloadBytes, queuedHeld and queuedCold are the engine's PayloadBytes,
	// Queued and Cold after the last batch or rebuild, for the
	// flo.dispatcher.payload_bytes and flo.dispatcher.queued_tasks gauges.
	payloadBytes, queuedHeld, queuedCold atomic.Int64

	// highWatermark is the commands partition's end as last fetched.
	highWatermark atomic.Int64

	// cmdNext is the next commands offset to apply: the checkpoint every
	// record of the partition carries.
	cmdNext atomic.Int64
	// progress is closed and replaced after each batch, for readers
	// waiting for the partition to pass an offset.
	progressMu sync.Mutex
	progress   chan struct{}

	readyMu sync.RWMutex
	// ready holds each queue's claimable tasks by priority, highest first.
	ready map[string][]engine.Level
	keys  map[string][2]string

	eng    *engine.Partition
	hinted time.Time
	// warmRetryAt holds the next read of cold tasks back from the view
	// after one failed, and warmWait paces them.
	warmRetryAt time.Time
	warmWait    backoff
	// intakeRetryAt holds commands back after intake failed (Postgres
	// away); intakeWait paces the attempts.
	intakeRetryAt time.Time
	intakeWait    backoff
	// poisoned are the commands dead-lettered and not yet passed by the
	// checkpoint, so a command tried again is not dead-lettered twice.
	poisoned map[int64]bool
	// traces makes the trace contexts of the commands intake reads.
	traces kafka.TraceMemo
	cancel context.CancelFunc
	exited chan struct{}

	// changes and entries are batch's lists, kept for the next batch while
	// they hold at most maxKeptChanges: a task's state is large, and
	// growing fresh lists every batch was a tenth of what the process
	// allocated at full load.
	changes []engine.Change
	entries []view.Entry
	// moved are the commands of the batch's intake that belong to other
	// partitions, sent there in the batch's transaction.
	moved []*kgo.Record
}

// backoff is a delay sequence of libs/retry (Policy.Backoff).
type backoff interface {
	NextBackOff() time.Duration
	Reset()
}

// maxKeptChanges bounds the lists a partition keeps between batches.
const maxKeptChanges = 4096

func newPartition(r *Replica, id int32, newTxn func() (*producer, error)) *partition {
	p := &partition{
		r: r, id: id, newTxn: newTxn, log: r.log.With("partition", id),
		ops: make(chan op, opQueue), cmdSignal: make(chan struct{}, 1), matSignal: make(chan struct{}, 1),
		intakeWait: intakeRetry.Backoff(), warmWait: intakeRetry.Backoff(), poisoned: map[int64]bool{},
		progress: make(chan struct{}), exited: make(chan struct{}),
		ready: map[string][]engine.Level{}, keys: map[string][2]string{},
	}
	p.materialized.Store(-1)
	p.snapshotViewed = -1
	return p
}

// start runs the partition until stop.
func (p *partition) start(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(ctx)
	go p.run(ctx)
}

// stop ends the partition and waits for its goroutine, which ends its
// batch in flight first.
func (p *partition) stop() {
	p.cancel()
	<-p.exited
}

func (p *partition) run(ctx context.Context) {
	defer close(p.exited)
	defer p.dropTxn()
	defer p.refuseQueued()
	wait := rebuildRetry.Backoff()
	for first := true; ; first = false {
		if !first {
			// A replica paused past its session (a zombie) must not take
			// the transactional id back, fencing the real owner, before
			// its heartbeat tells it it lost the partition: ask the group
			// coordinator first.
			owns, err := p.r.stillOwns(ctx, p.id)
			if err != nil || !owns {
				pause := sessionTimeout
				if err != nil {
					pause = wait.NextBackOff()
				}
				p.log.WarnContext(ctx, "not rebuilding a partition the group may no longer assign here", "error", err, "retry_in", pause.String())
				if !retry.Sleep(ctx, pause) {
					return
				}
				continue
			}
		}
		err := p.makeTxn()
		if err == nil {
			err = p.rebuild(ctx)
		}
		if err == nil {
			wait.Reset()
			err = p.serve(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		p.dropTxn()
		if errors.Is(err, view.ErrRekeyed) {
			p.r.fail(err)
			return
		}
		if errors.Is(err, errFenced) {
			// Another producer took the transactional id: a new owner,
			// whose assignment revokes the partition here within a
			// session, or a replica paused past its session (a zombie)
			// whose failed batch rebuilt before it saw it lost the
			// partition. Dropping the partition then would leave it
			// unserved while the group still assigns it here: wait a
			// session for the revocation, then take the id back.
			p.log.WarnContext(ctx, "partition taken over; waiting for its revocation", "wait", sessionTimeout.String())
			if !retry.Sleep(ctx, sessionTimeout) {
				return
			}
			continue
		}
		p.log.ErrorContext(ctx, "partition failed; rebuilding it from the view and the log", "error", err)
		if !retry.Sleep(ctx, wait.NextBackOff()) {
			return
		}
	}
}

// makeTxn makes the partition's producer if it has none.
func (p *partition) makeTxn() error {
	if p.txn != nil {
		return nil
	}
	txn, err := p.newTxn()
	if err != nil {
		return fmt.Errorf("make the partition's producer: %w", err)
	}
	p.txn = txn
	return nil
}

// dropTxn closes the partition's producer after a failure, without another
// call on it. franz-go answers a failed transaction by initializing the
// producer id again on the next call (KIP-360), naming the id and the epoch
// it had; a broker that takes a stale epoch there (kfake does; Kafka
// refuses it) would hand a replica paused past its session (a zombie) the
// transactional id back, before its rebuild asks the group whether it still
// owns the partition. A new producer takes the id only after that check.
// The broker aborts what the old one left open when the new one, or the
// next owner's, takes the id.
func (p *partition) dropTxn() {
	if p.txn != nil {
		p.txn.Close()
		p.txn = nil
	}
}

// refuseQueued answers calls still queued when the partition stops: the
// caller asks the new owner.
func (p *partition) refuseQueued() {
	for {
		select {
		case o := <-p.ops:
			o.done(ErrNotOwner)
		default:
			return
		}
	}
}

// submit queues o and waits for its answer. queued says whether o was
// queued: then it is answered on answered even when ctx ended first.
func (p *partition) submit(ctx context.Context, o op, answered <-chan error) (queued bool, err error) {
	if err := p.enqueue(ctx, o); err != nil {
		return false, err
	}
	return true, await(ctx, answered)
}

// enqueue hands o to the partition's goroutine without waiting for it.
func (p *partition) enqueue(ctx context.Context, o op) error {
	select {
	case p.ops <- o:
		return nil
	case <-p.exited:
		return ErrNotOwner
	case <-ctx.Done():
		return ctx.Err()
	}
}

// await waits for the answer of an op enqueued, or for ctx to end.
func await(ctx context.Context, answered <-chan error) error {
	select {
	case err := <-answered:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pushCommands hands polled commands to the partition.
func (p *partition) pushCommands(recs []*kgo.Record) {
	p.cmdMu.Lock()
	p.cmds = append(p.cmds, recs...)
	p.cmdMu.Unlock()
	select {
	case p.cmdSignal <- struct{}{}:
	default:
	}
}

// putBack returns commands intake could not apply to the queue's front.
func (p *partition) putBack(recs []*kgo.Record) {
	p.cmdMu.Lock()
	p.cmds = append(recs[:len(recs):len(recs)], p.cmds...)
	p.cmdMu.Unlock()
}

// takeCommands returns up to maxBatchCommands queued commands.
func (p *partition) takeCommands() []*kgo.Record {
	p.cmdMu.Lock()
	defer p.cmdMu.Unlock()
	n := min(len(p.cmds), maxBatchCommands)
	out := p.cmds[:n:n]
	p.cmds = p.cmds[n:]
	if len(p.cmds) > 0 {
		select {
		case p.cmdSignal <- struct{}{}:
		default:
		}
	}
	return out
}

// viewReached is told by the materializer that the view holds the
// partition's records up to offset.
func (p *partition) viewReached(offset int64) {
	for {
		cur := p.materialized.Load()
		if offset <= cur || p.materialized.CompareAndSwap(cur, offset) {
			break
		}
	}
	select {
	case p.matSignal <- struct{}{}:
	default:
	}
}

// rebuild makes the partition's state from the view and the log. It first
// takes the partition's transactional id, which aborts whatever a previous
// owner left open and fences it, so the log it then reads to its end is
// final.
func (p *partition) rebuild(ctx context.Context) error {
	start := time.Now()
	// A replica paused through a repartition may be given a partition of
	// the new count when it wakes: it must not take the id of a partition
	// it would key by the old one.
	if err := view.RequireLayout(ctx, p.r.pool, p.r.n); err != nil {
		return fmt.Errorf("rebuild from the view and the log: %w", err)
	}
	if err := p.takeID(ctx); err != nil {
		return err
	}
	eng := engine.New(p.id)
	eng.SetLimits(p.r.cfg.Memory)
	keys := map[string][2]string{}
	// The log is read first, from the offset the view has now: the
	// snapshot read next is at or past it (the view's offsets only move
	// forward) and skips the records before its own. So the snapshot stays
	// as short as its reads, while it can still say which of the tasks the
	// replay takes in again it had counted cold.
	from, _, err := view.Offsets(ctx, p.r.pool, p.id)
	if err != nil {
		return fmt.Errorf("rebuild from the view and the log: %w", err)
	}
	events, err := readEvents(ctx, p.r.cfg.Kafka, p.r.admin, p.id, from, p.log)
	if err != nil {
		return fmt.Errorf("replay events: %w", err)
	}
	var (
		evNext, cmdNext int64
		cold            map[[2]string]view.Cold
		back            map[[2]string]int
	)
	err = p.r.readSnapshot(ctx, func(tx pgx.Tx) error {
		var err error
		if evNext, cmdNext, err = view.Offsets(ctx, tx, p.id); err != nil {
			return err
		}
		if cold, err = view.LoadLive(ctx, tx, p.id, p.r.cfg.Memory, time.Now(), func(t engine.Task) {
			eng.Load(t)
			knowQueue(keys, t.Namespace, t.Action)
		}); err != nil {
			return err
		}
		events.from(evNext)
		if len(cold) > 0 {
			back, err = view.QueuedAmong(ctx, tx, p.id, events.leftOut(eng))
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("rebuild from the view and the log: %w", err)
	}
	cmdNext = p.replay(eng, keys, events, cmdNext)
	for q, c := range cold {
		eng.SetCold(q[0], q[1], c.N-back[q], c.Due, c.DueLast)
	}
	p.snapshotViewed = evNext - 1
	p.eng = eng
	p.keys = keys
	p.readyMu.Lock()
	p.ready = map[string][]engine.Level{}
	p.readyMu.Unlock()
	p.cmdNext.Store(cmdNext)
	p.refreshReady(time.Now(), true)
	p.r.metrics.rebuilds.Add(ctx, 1)
	p.gauge()
	p.log.InfoContext(ctx, "partition rebuilt", "tasks", eng.Len(), "cold", eng.Cold(), "payload_bytes", eng.PayloadBytes(), "replayed", len(events.entries),
		"events_from", evNext, "commands_from", cmdNext, "took", time.Since(start).String())
	return nil
}

// takeID has the partition's producer take the transactional id, which
// fences whoever held it, before the rebuild reads the log: nothing an
// earlier owner writes after this can commit.
func (p *partition) takeID(ctx context.Context) error {
	if _, _, err := p.txn.ProducerID(ctx); err != nil {
		if fenced(err) {
			return errFenced
		}
		return fmt.Errorf("take transactional id: %w", err)
	}
	p.txn.took = p.txn.inits.n.Load()
	return nil
}

// replayLog is the committed events records a rebuild reads again, in
// offset order: each one's task state as the view takes it (with the
// record's offset and commands checkpoint), and its change's type.
type replayLog struct {
	entries []view.Entry
	types   []taskevent.Type
}

// from drops the records before offset.
func (l *replayLog) from(offset int64) {
	i, _ := slices.BinarySearchFunc(l.entries, offset, func(e view.Entry, o int64) int { return cmp.Compare(e.Offset, o) })
	l.entries, l.types = l.entries[i:], l.types[i:]
}

// leftOut lists the tasks of the records that eng does not hold: those
// the view's snapshot left out of the rebuild, final or cold there.
func (l *replayLog) leftOut(eng *engine.Partition) []uuid.UUID {
	seen := map[uuid.UUID]bool{}
	var ids []uuid.UUID
	for i := range l.entries {
		id := l.entries[i].Task.ID
		if l.types[i] == taskevent.Rejected || seen[id] || eng.Has(id) {
			continue
		}
		seen[id] = true
		ids = append(ids, id)
	}
	return ids
}

// readEvents reads the committed events of events partition id from offset
// from to the log's last stable offset, in offset order. Records written
// before log-first dispatch, and any that do not decode, are skipped
// (logged).
func readEvents(ctx context.Context, conn config.Kafka, admin *kgo.Client, id int32, from int64, log *slog.Logger) (replayLog, error) {
	adm := kadm.NewClient(admin)
	ends, err := adm.ListCommittedOffsets(ctx, kafka.TaskEventsTopic)
	if err != nil {
		return replayLog{}, fmt.Errorf("list last stable offsets: %w", err)
	}
	end, ok := ends.Lookup(kafka.TaskEventsTopic, id)
	if !ok || end.Err != nil {
		return replayLog{}, fmt.Errorf("last stable offset of %s/%d: %v", kafka.TaskEventsTopic, id, end.Err)
	}
	if end.Offset <= from {
		return replayLog{}, nil
	}
	cl, err := kafka.NewClient(conn,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{kafka.TaskEventsTopic: {id: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Control records carry offsets too; without them a log ending in
		// a transaction marker would never be seen to reach its end.
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchMaxBytes(64<<20),
	)
	if err != nil {
		return replayLog{}, err
	}
	defer cl.Close()
	var (
		legacy int
		next   = from
		out    replayLog
	)
	defer func() {
		if legacy > 0 {
			log.InfoContext(ctx, "skipped task events written before log-first dispatch", "records", legacy)
		}
	}()
	for next < end.Offset {
		// A replay that stops moving is given up and tried again from
		// the start (logged), rather than waiting in silence.
		pctx, cancel := context.WithTimeout(ctx, replayStall)
		fetches := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return replayLog{}, ctx.Err()
		}
		if len(fetches.Records()) == 0 && pctx.Err() != nil {
			return replayLog{}, fmt.Errorf("replay stalled at offset %d of %d", next, end.Offset)
		}
		if err := fetchErr(fetches); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return replayLog{}, err
		}
		for _, rec := range fetches.Records() {
			next = rec.Offset + 1
			if rec.Attrs.IsControl() {
				continue
			}
			c, cmd, err := engine.Decode(rec)
			if errors.Is(err, engine.ErrNoState) {
				// Written before log-first dispatch; the view has its task.
				legacy++
				continue
			}
			if err != nil {
				// Every record here was written by an owner; one that does
				// not decode is skipped rather than blocking the partition.
				log.ErrorContext(ctx, "skipping an undecodable task event", "offset", rec.Offset, "error", err)
				continue
			}
			out.entries = append(out.entries, view.Entry{Partition: id, Offset: rec.Offset, CmdOffset: cmd, Task: c.Task})
			out.types = append(out.types, c.Type)
		}
	}
	return out, nil
}

// replay applies events to eng and returns the commands checkpoint its
// records carry, cmdNext at least. Each replayed state goes to the
// materializer too: the previous owner may have died before its view had
// them.
func (p *partition) replay(eng *engine.Partition, keys map[string][2]string, events replayLog, cmdNext int64) int64 {
	for i := range events.entries {
		e := &events.entries[i]
		eng.Apply(engine.Change{Type: events.types[i], Task: e.Task})
		eng.Recorded(e.Task.ID, e.Offset)
		knowQueue(keys, e.Task.Namespace, e.Task.Action)
		cmdNext = max(cmdNext, e.CmdOffset)
	}
	p.r.mat.Add(events.entries...)
	return cmdNext
}

// serve applies batches until ctx ends (nil) or a transaction fails.
func (p *partition) serve(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.resetTimer(timer)
		var ops []op
		select {
		case <-ctx.Done():
			return nil
		case o := <-p.ops:
			ops = append(ops, o)
		case <-p.cmdSignal:
		case <-p.matSignal:
		case <-timer.C:
		}
		ops = p.drainOps(ops)
		if err := p.batch(ctx, ops); err != nil {
			return err
		}
		p.gauge()
		p.maybeWarm(ctx)
	}
}

func (p *partition) resetTimer(t *time.Timer) {
	due := p.eng.NextDue()
	for _, at := range []time.Time{p.intakeRetryAt, p.warmRetryAt} {
		if at.After(time.Now()) && (due.IsZero() || at.Before(due)) {
			due = at
		}
	}
	wait := time.Hour
	if !due.IsZero() {
		wait = max(time.Until(due), 0)
	}
	t.Reset(wait)
}

func (p *partition) drainOps(ops []op) []op {
	for len(ops) < maxBatchOps {
		select {
		case o := <-p.ops:
			ops = append(ops, o)
		default:
			return ops
		}
	}
	return ops
}

// batch applies one batch: queued commands, calls and what time did, then
// records the changes in one transaction and answers the calls.
func (p *partition) batch(ctx context.Context, ops []op) error {
	now := time.Now()
	p.eng.Materialized(p.materialized.Load())
	cmdBefore := p.cmdNext.Load()
	p.moved = nil
	changes := p.changes[:0]
	defer func() { p.changes = keep(changes) }()
	var cmds []*kgo.Record
	if now.After(p.intakeRetryAt) {
		cmds = p.takeCommands()
		var err error
		if changes, err = p.intake(ctx, cmds, now, changes); err != nil {
			// Postgres away: the commands wait, and the calls go on.
			p.putBack(cmds)
			cmds = nil
			wait := p.intakeWait.NextBackOff()
			p.intakeRetryAt = now.Add(wait)
			p.log.WarnContext(ctx, "applying commands failed; trying again", "retry_in", wait.String(), "error", err)
		} else {
			p.intakeWait.Reset()
		}
	}
	for _, o := range ops {
		changes = o.apply(p, now, changes)
	}
	changes = append(changes, p.eng.Tick(now)...)
	leased, leases := p.serveStanding(now)
	changes = append(changes, leased...)
	if len(changes) == 0 && len(p.moved) == 0 {
		// Intake copied what it keeps of the commands; a batch whose
		// transaction fails puts them back instead.
		kafka.Recycle(cmds)
		for _, o := range ops {
			o.done(nil)
		}
		// A delayed task may have come due.
		p.refreshReady(now, true)
		p.advance(cmdBefore)
		return nil
	}
	// Counted before the commit: a claim that asks meanwhile is applied
	// after it (a failed commit rebuilds the partition first, so nothing
	// uncommitted is handed out).
	p.refreshReady(now, false, changes...)
	// A stop (revocation, SIGTERM) lets the batch in flight commit.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopWait)
	offsets, err := p.record(rctx, changes, p.moved)
	cancel()
	if err != nil {
		// The rebuilt partition applies them again from its checkpoint:
		// the group consumer has moved past them and will not fetch them
		// again.
		p.putBack(cmds)
		for _, o := range ops {
			o.done(errUnavailable(err))
		}
		for _, l := range leases {
			l.s.deliver(l.reserved, nil)
		}
		return err
	}
	kafka.Recycle(cmds)
	for _, o := range ops {
		o.done(nil)
	}
	for _, l := range leases {
		l.s.deliver(l.reserved, l.got)
	}
	entries := p.entries[:0]
	cmd := p.cmdNext.Load()
	p.eng.RecordedAll(changes, offsets)
	for i, c := range changes {
		entries = append(entries, view.Entry{Partition: p.id, Offset: offsets[i], CmdOffset: cmd, Task: c.Task})
	}
	// Add copies the entries.
	p.r.mat.Add(entries...)
	p.entries = keep(entries)
	p.r.metrics.count(ctx, changes)
	p.advance(cmdBefore)
	return nil
}

// keep returns list emptied for reuse (its states dropped, so they can be
// collected), or nil when it grew past maxKeptChanges.
func keep[T any](list []T) []T {
	if cap(list) > maxKeptChanges {
		return nil
	}
	clear(list)
	return list[:0]
}

// advance publishes progress and, when commands were applied, commits the
// group offset as a hint of where the next owner's fetch may start (the
// checkpoint in the records is what counts).
func (p *partition) advance(cmdBefore int64) {
	p.progressMu.Lock()
	close(p.progress)
	p.progress = make(chan struct{})
	p.progressMu.Unlock()
	// At most once a second: the hint only shortens a new owner's fetch.
	if next := p.cmdNext.Load(); next > cmdBefore && time.Since(p.hinted) >= hintEvery {
		p.hinted = time.Now()
		p.r.group.CommitOffsets(context.Background(), map[string]map[int32]kgo.EpochOffset{
			kafka.CommandsTopic: {p.id: {Epoch: -1, Offset: next}},
		}, nil)
	}
}

// waitCommands waits until the partition applied its commands up to
// offset, or ctx ends.
func (p *partition) waitCommands(ctx context.Context, offset int64) error {
	for {
		p.progressMu.Lock()
		ch := p.progress
		p.progressMu.Unlock()
		if p.cmdNext.Load() >= offset {
			return nil
		}
		select {
		case <-ch:
		case <-p.exited:
			return ErrNotOwner
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// intake turns commands into tasks. Commands below the checkpoint were
// applied before (a fetch that started at an older group offset). An
// invocation with an idempotency key or an origin may repeat an older one
// the partition no longer holds, so those are looked up in the view.
// Commands of another partition's tasks are left in p.moved for the batch
// to send on. It appends the changes to changes, and returns changes as it
// was on error.
func (p *partition) intake(ctx context.Context, recs []*kgo.Record, now time.Time, changes []engine.Change) ([]engine.Change, error) {
	next := p.cmdNext.Load()
	invs := make([]engine.Invocation, 0, len(recs))
	var lookup []uuid.UUID
	var moved []*kgo.Record
	for _, rec := range recs {
		if rec.Offset < next {
			continue
		}
		next = rec.Offset + 1
		inv, err := decodeInvocation(rec, &p.traces)
		if err == nil {
			if to := kafka.PartitionOf(inv.TaskID.String(), p.r.n); to != p.id {
				// Reads and reports find a task by its id's partition. A
				// command lands elsewhere when it was sent under another
				// partition count (before a repartition, or by a producer
				// that has not seen the new count yet) or keyed by
				// something else: it moves there, in this batch's
				// transaction.
				moved = append(moved, moveCommand(rec, inv.TaskID.String(), p.id, to))
				continue
			}
		}
		if err != nil {
			if !p.poisoned[rec.Offset] {
				p.poisoned[rec.Offset] = true
				p.r.poison(ctx, rec, err)
			}
			continue
		}
		invs = append(invs, inv)
		// While some tasks are cold, only the view knows them all. A moved
		// command may be moved again (its move is not checkpointed when
		// its batch records no task event), after its task was done and
		// let go.
		if (inv.IdempotencyKey != "" || inv.Origin != "" || p.eng.Cold() > 0 || wasMoved(rec)) && !p.eng.Has(inv.TaskID) {
			lookup = append(lookup, inv.TaskID)
		}
	}
	if len(invs) == 0 {
		p.moved = moved
		p.advanceCommands(next)
		return changes, nil
	}
	var existing map[uuid.UUID]bool
	if len(lookup) > 0 {
		var err error
		if existing, err = view.Existing(ctx, p.r.pool, lookup); err != nil {
			return changes, fmt.Errorf("look up repeated invocations: %w", err)
		}
	}
	refs := make([]catalog.Ref, len(invs))
	for i, inv := range invs {
		refs[i] = catalog.Ref{Namespace: inv.Namespace, Action: inv.Action}
	}
	actions, err := p.r.cat.Lookup(ctx, p.r.pool, refs)
	if err != nil {
		return changes, fmt.Errorf("look up actions: %w", err)
	}
	for _, inv := range invs {
		if existing[inv.TaskID] {
			continue
		}
		a, ok := actions[store.Key(inv.Namespace, inv.Action)]
		switch {
		case !ok:
			changes = p.eng.Invoke(changes, inv, nil, engine.RejectNotFound, now)
		case !a.Enabled && inv.Origin != "":
			// A workflow step must not wait on a disabled action; a plain
			// invocation waits until the action is enabled again.
			changes = p.eng.Invoke(changes, inv, &a.Settings, engine.RejectDisabled, now)
		default:
			s := a.Settings
			changes = p.eng.Invoke(changes, inv, &s, "", now)
		}
	}
	p.moved = moved
	p.advanceCommands(next)
	return changes, nil
}

// advanceCommands moves the checkpoint to next.
func (p *partition) advanceCommands(next int64) {
	p.cmdNext.Store(next)
	for off := range p.poisoned {
		if off < next {
			delete(p.poisoned, off)
		}
	}
}

// record writes changes as one transaction on the partition's events and
// outcomes, with the commands moved to other partitions, and returns each
// change's events record's offset.
func (p *partition) record(ctx context.Context, changes []engine.Change, moved []*kgo.Record) ([]int64, error) {
	events, outcomes, err := engine.EncodeAll(changes, p.id, p.cmdNext.Load())
	if err != nil {
		return nil, err
	}
	recs := slices.Concat(events, outcomes, moved)
	if err := p.txn.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("begin transaction: %w", err)
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	wg.Add(len(recs))
	produced := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			firstErr = cmp.Or(firstErr, err)
			mu.Unlock()
		}
		wg.Done()
	}
	for _, r := range recs {
		p.txn.Produce(ctx, r, produced)
	}
	if err := p.txn.Flush(ctx); err != nil {
		firstErr = cmp.Or(firstErr, err)
	}
	wg.Wait()
	// A producer that initialized its id again since the partition took it
	// may have taken it from the partition's next owner, and its records
	// would commit: they are aborted. (An initialization inside the commit
	// below aborts the open transaction itself, and the commit then fails.)
	if firstErr == nil && p.txn.tookOnItsOwn() {
		_ = p.txn.EndTransaction(ctx, kgo.TryAbort)
		p.log.WarnContext(ctx, "the partition's producer took the transactional id again on its own; its transaction is aborted")
		return nil, errFenced
	}
	// A failed transaction is not aborted here: the producer is dropped
	// (dropTxn says why), and the next one to take the id aborts it.
	if firstErr == nil {
		if err := p.txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		if fenced(firstErr) {
			return nil, errFenced
		}
		return nil, fmt.Errorf("record %d task events: %w", len(recs), firstErr)
	}
	offsets := make([]int64, len(events))
	for i, r := range events {
		offsets[i] = r.Offset
	}
	return offsets, nil
}

// fenced reports whether err says a newer producer took the transactional id.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}

// knowQueue adds the queue of namespace and action to keys (a partition's
// known queues, by store.Key) and returns its key.
func knowQueue(keys map[string][2]string, namespace, action string) string {
	k := store.Key(namespace, action)
	if _, ok := keys[k]; !ok {
		keys[k] = [2]string{namespace, action}
	}
	return k
}

// refreshReady recounts the claimable tasks of the queues changes touched,
// or of every known queue when all is set (after a timer, when delayed
// tasks may have come due), for claims to know which partitions to ask.
func (p *partition) refreshReady(now time.Time, all bool, changes ...engine.Change) {
	touched := map[string]bool{}
	for _, c := range changes {
		touched[knowQueue(p.keys, c.Task.Namespace, c.Task.Action)] = true
	}
	if all {
		for k := range p.keys {
			touched[k] = true
		}
	}
	p.readyMu.Lock()
	defer p.readyMu.Unlock()
	for k := range touched {
		na := p.keys[k]
		if levels := p.eng.ReadyLevels(na[0], na[1], now); len(levels) > 0 {
			p.ready[k] = levels
		} else {
			delete(p.ready, k)
		}
	}
}

// readyFor is how many tasks of ns among actions the partition last
// counted as claimable.
func (p *partition) readyFor(ns string, actions []string) int {
	p.readyMu.RLock()
	defer p.readyMu.RUnlock()
	n := 0
	for _, a := range actions {
		for _, l := range p.ready[store.Key(ns, a)] {
			n += l.Count
		}
	}
	return n
}

// levelsFor is readyFor by priority, highest first, appended to out.
func (p *partition) levelsFor(ns string, actions []string, out []engine.Level) []engine.Level {
	p.readyMu.RLock()
	defer p.readyMu.RUnlock()
	start := len(out)
	for _, a := range actions {
		out = append(out, p.ready[store.Key(ns, a)]...)
	}
	if len(actions) > 1 {
		// Merged across actions: one level per priority.
		levels := out[start:]
		slices.SortFunc(levels, func(a, b engine.Level) int { return cmp.Compare(b.Priority, a.Priority) })
		merged := levels[:0]
		for _, l := range levels {
			if n := len(merged); n > 0 && merged[n-1].Priority == l.Priority {
				merged[n-1].Count += l.Count
				continue
			}
			merged = append(merged, l)
		}
		out = out[:start+len(merged)]
	}
	return out
}

func fetchErr(f kgo.Fetches) error {
	var out error
	f.EachError(func(_ string, _ int32, err error) {
		if out == nil {
			out = err
		}
	})
	return out
}

// gauge publishes the engine's sizes for the partition gauges.
func (p *partition) gauge() {
	p.payloadBytes.Store(p.eng.PayloadBytes())
	p.queuedHeld.Store(int64(p.eng.Queued()))
	p.queuedCold.Store(int64(p.eng.Cold()))
}

// maybeWarm reads the partition's next cold tasks back from the view once
// it holds few enough queued tasks (engine.Partition.Warm). The read runs
// off the partition's goroutine and comes back as a call.
func (p *partition) maybeWarm(ctx context.Context) {
	if time.Now().Before(p.warmRetryAt) {
		return
	}
	w := p.eng.Warm()
	if w == nil {
		return
	}
	eng := p.eng
	go func() {
		tasks, err := view.LoadCold(ctx, p.r.pool, p.id, w)
		select {
		case p.ops <- &warmOp{eng: eng, w: w, tasks: tasks, err: err}:
		case <-p.exited:
		}
	}()
}

// warmOp holds the cold tasks read back from the view again.
type warmOp struct {
	eng   *engine.Partition
	w     *engine.Warming
	tasks []engine.Task
	err   error
}

func (o *warmOp) apply(p *partition, now time.Time, changes []engine.Change) []engine.Change {
	if o.eng != p.eng {
		return changes // read for an engine a rebuild replaced
	}
	if o.err != nil {
		p.eng.Unwarm(o.w)
		wait := p.warmWait.NextBackOff()
		p.warmRetryAt = now.Add(wait)
		p.log.Warn("reading cold tasks back from the view failed; trying again", "retry_in", wait.String(), "error", o.err)
		return changes
	}
	p.warmWait.Reset()
	p.eng.Warmed(o.w, o.tasks)
	for _, t := range o.tasks {
		knowQueue(p.keys, t.Namespace, t.Action)
	}
	p.refreshReady(now, true)
	return changes
}

func (o *warmOp) done(error) {}
