// Package owner runs the task partitions a dispatcher replica owns. The
// replicas form one consumer group on the commands topic; the group's
// assignment decides who owns which partition. An owner keeps its
// partitions' live tasks in memory (engine.Partition), applies commands,
// worker calls and timers to them on one goroutine per partition, and
// records every change on the events partition of the same number in one
// Kafka transaction per batch, under a transactional id per partition so a
// replica that lost a partition can no longer commit anything for it. The
// records feed the view (package view); a new owner rebuilds from the view
// and the records after it. See docs/design/dispatch.md.
package owner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/retry"
	"github.com/razorbill/flo/services/dispatcher/internal/catalog"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/view"
)

// ownersRetry paces writing the owners table while Postgres is away.
var ownersRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// stopWait bounds how long a revoked partition may take to end its batch.
const stopWait = 10 * time.Second

// sessionTimeout is how long the group waits for a silent replica before
// giving its partitions to others.
const sessionTimeout = 10 * time.Second

// rebalanceTimeout is how long a rebalance waits for the group's members
// to join and sync.
const rebalanceTimeout = 2 * stopWait

// ErrNotOwner answers a call for a partition this replica does not own
// (any more); the caller asks the owner. It is ABORTED on the wire.
var ErrNotOwner = errors.New("this dispatcher replica does not own the task's partition")

// isNotOwner reports whether err says the replica does not own the partition.
func isNotOwner(err error) bool { return errors.Is(err, ErrNotOwner) }

// ErrUnavailable marks a failure of the log or the view that a retry may
// not meet: UNAVAILABLE on the wire.
var ErrUnavailable = errors.New("task log unavailable")

func errUnavailable(err error) error { return fmt.Errorf("%w: %v", ErrUnavailable, err) }

// Config is what a Replica needs besides its dependencies.
type Config struct {
	Kafka config.Kafka
	// Partitions is the partition count of the commands and events topics
	// when this replica creates them (FLO_KAFKA_PARTITIONS).
	Partitions int32
	// MaxPayloadBytes sizes the transactional producers' batches.
	MaxPayloadBytes int
	// Address is this replica's internal gRPC address as peers and
	// gateways reach it; ReplicaID names it in the owners table.
	Address   string
	ReplicaID string
	// Memory bounds the payloads each partition keeps in memory
	// (FLO_DISPATCH_PAYLOAD_MEMORY, FLO_DISPATCH_HOT_HORIZON).
	Memory engine.Limits
}

// Replica is one dispatcher replica's share of the task partitions.
type Replica struct {
	cfg     Config
	log     *slog.Logger
	pool    *pgxpool.Pool
	cat     *catalog.Catalog
	mat     *view.Materializer
	admin   *kgo.Client
	group   *kgo.Client
	dlq     *kafka.DeadLetterer
	metrics *metrics
	n       int32
	// meter, payloadBytes and queuedTasks report flo.dispatcher.payload_bytes
	// and flo.dispatcher.queued_tasks while Run runs.
	meter        metric.Meter
	payloadBytes metric.Int64ObservableGauge
	queuedTasks  metric.Int64ObservableGauge

	mu    sync.RWMutex
	parts map[int32]*partition
	ctx   context.Context
	// fail ends Run with its cause: the view was repartitioned under this
	// replica (view.ErrRekeyed), and a restart runs on the new count.
	fail context.CancelCauseFunc

	standing  standingClaims
	ends      claimEnds
	claimTurn atomic.Uint32
	closing   chan struct{}
	closeOnce sync.Once
}

// New joins nothing yet: it creates the topics if needed, checks that both
// have the same partition count, and prepares the group client; Run joins.
func New(ctx context.Context, cfg Config, pool *pgxpool.Pool, cat *catalog.Catalog, log *slog.Logger, meter metric.Meter) (*Replica, error) {
	r := &Replica{cfg: cfg, log: log, pool: pool, cat: cat, parts: map[int32]*partition{}, closing: make(chan struct{})}
	var err error
	if r.metrics, err = newMetrics(meter); err != nil {
		return nil, err
	}
	r.meter = meter
	if r.queuedTasks, err = meter.Int64ObservableGauge("flo.dispatcher.queued_tasks", metric.WithUnit("{task}"),
		metric.WithDescription("Queued tasks of a partition this replica owns: held in memory (held=true, bounded by FLO_DISPATCH_QUEUED_TASKS), or kept only in the view with their places in the queue (held=false) until the partition's queue drains.")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	if r.payloadBytes, err = meter.Int64ObservableGauge("flo.dispatcher.payload_bytes", metric.WithUnit("By"),
		metric.WithDescription("Bytes of task payloads a partition this replica owns holds in memory (bounded by FLO_DISPATCH_PAYLOAD_MEMORY once the view has them).")); err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	// Topics, dead letters and offset lookups; the group client is made
	// by Run, since a group client joins as soon as it exists.
	r.admin, err = kafka.NewClient(cfg.Kafka, kgo.ProducerBatchMaxBytes(int32(max(kafka.MaxRecordSize(cfg.MaxPayloadBytes), 1<<20))))
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	if err := r.checkTopics(ctx); err != nil {
		r.admin.Close()
		return nil, err
	}
	if r.mat, err = view.NewMaterializer(pool, r.n, log, meter, r.viewReached); err != nil {
		r.admin.Close()
		return nil, err
	}
	if r.dlq, err = kafka.NewDeadLetterer(r.admin, kafka.DispatcherGroup, log); err != nil {
		r.admin.Close()
		return nil, err
	}
	// Tasks queued before log-first dispatch are loaded by their
	// partition's owner once they have one.
	moved, err := view.AssignPartitions(ctx, pool, r.PartitionOf)
	if err != nil {
		r.admin.Close()
		return nil, err
	}
	if moved > 0 {
		log.InfoContext(ctx, "gave tasks from before log-first dispatch their partitions", "tasks", moved)
	}
	return r, nil
}

// checkTopics creates the task topics when missing and refuses topics whose
// partition counts differ: a task's events and outcomes partitions must be
// its commands partition's number. The outcomes topic, which came later, is
// created with the count the other two have, whatever the setting says.
func (r *Replica) checkTopics(ctx context.Context) error {
	if err := kafka.EnsureTopics(ctx, r.admin, r.cfg.Partitions, kafka.CommandsTopic, kafka.TaskEventsTopic); err != nil {
		return err
	}
	counts, err := partitionCounts(ctx, r.admin, kafka.CommandsTopic, kafka.TaskEventsTopic)
	if err != nil {
		return err
	}
	if counts[0] > 0 {
		if err := kafka.EnsureTopics(ctx, r.admin, counts[0], kafka.TaskOutcomesTopic); err != nil {
			return err
		}
	}
	outcomes, err := partitionCounts(ctx, r.admin, kafka.TaskOutcomesTopic)
	if err != nil {
		return err
	}
	topics := []string{kafka.CommandsTopic, kafka.TaskEventsTopic, kafka.TaskOutcomesTopic}
	counts = append(counts, outcomes...)
	if slices.Min(counts) == 0 || slices.Min(counts) != slices.Max(counts) {
		return fault.Preconditionf("topics %v have %v partitions and must have the same count: finish a change of it with `dispatcher repartition %d` (docs/design/dispatch.md)",
			topics, counts, slices.Max(counts))
	}
	r.n = counts[0]
	// The view's rows are keyed by the count they were written with.
	layout, err := view.AdoptLayout(ctx, r.pool, r.n)
	if err != nil {
		return err
	}
	if layout != r.n {
		return fault.Preconditionf("the task view is keyed by %d partitions and the task topics have %d: finish the change with `dispatcher repartition %d` (docs/design/dispatch.md)",
			layout, r.n, max(layout, r.n))
	}
	return nil
}

// partitionCounts is how many partitions each topic has, in order; zero
// for one that does not exist.
func partitionCounts(ctx context.Context, admin *kgo.Client, topics ...string) ([]int32, error) {
	details, err := kadm.NewClient(admin).ListTopics(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("describe task topics: %w", err)
	}
	counts := make([]int32, len(topics))
	for i, t := range topics {
		counts[i] = int32(len(details[t].Partitions))
	}
	return counts, nil
}

// PartitionOf is the partition of a task id.
func (r *Replica) PartitionOf(taskID string) int32 { return kafka.PartitionOf(taskID, r.n) }

// Run polls commands and hands them to the owned partitions until ctx ends,
// then stops every partition (each ends its batch), flushes the view and
// leaves the group so the partitions move at once.
func (r *Replica) Run(ctx context.Context) error {
	defer r.admin.Close()
	pollCtx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	r.mu.Lock()
	r.ctx, r.fail = ctx, fail
	r.mu.Unlock()
	group, err := kafka.NewClient(r.cfg.Kafka,
		kgo.ConsumerGroup(kafka.DispatcherGroup),
		// Says to the readers of the task outcomes that this replica
		// writes them (kafka.TakeOverTaskOutcomes).
		kgo.ClientID(kafka.DispatcherClientID),
		kgo.ConsumeTopics(kafka.CommandsTopic),
		kgo.DisableAutoCommit(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.OnPartitionsAssigned(r.assigned),
		kgo.OnPartitionsRevoked(r.revoked),
		kgo.OnPartitionsLost(r.revoked),
		// A replica that dies without leaving holds its partitions until
		// its session times out.
		kgo.SessionTimeout(sessionTimeout),
		// A member that joined a rebalance and was paused before it synced
		// holds every partition's move until this passes (franz-go's
		// default is a minute); a revocation's batch (stopWait) fits in it.
		kgo.RebalanceTimeout(rebalanceTimeout),
		kgo.HeartbeatInterval(time.Second),
		// A partition recycles its commands once the transaction that
		// applied them committed (partition.batch).
		kafka.PooledFetches(),
	)
	if err != nil {
		return fmt.Errorf("commands consumer: %w", err)
	}
	r.group = group
	go r.watchPeers(ctx)
	if reg, err := kafka.RegisterLag(kafka.DispatcherGroup, r.lag); err != nil {
		r.log.WarnContext(ctx, "commands lag not reported", "error", err)
	} else {
		defer func() { _ = reg.Unregister() }()
	}
	if reg, err := r.meter.RegisterCallback(r.observePartitions, r.payloadBytes, r.queuedTasks); err != nil {
		r.log.WarnContext(ctx, "partition gauges not reported", "error", err)
	} else {
		defer func() { _ = reg.Unregister() }()
	}
	matCtx, stopMat := context.WithCancel(context.WithoutCancel(ctx))
	matDone := make(chan error, 1)
	go func() {
		// It ends on its own only on view.ErrRekeyed.
		err := r.mat.Run(matCtx)
		if err != nil {
			fail(err)
		}
		matDone <- err
	}()
	defer func() {
		r.stopAll()
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopWait)
		if err := r.mat.Flush(flushCtx); err != nil {
			r.log.WarnContext(ctx, "view not flushed at stop; the next owner replays it", "error", err)
		}
		cancel()
		stopMat()
		<-matDone
		r.group.Close()
	}()
	for {
		fetches := r.group.PollRecords(pollCtx, 2*maxBatchCommands)
		if ctx.Err() != nil {
			return nil
		}
		if pollCtx.Err() != nil {
			return fmt.Errorf("task view: %w", context.Cause(pollCtx))
		}
		fetches.EachError(func(topic string, p int32, err error) {
			r.log.WarnContext(ctx, "fetch commands failed", "topic", topic, "partition", p, "error", err)
		})
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) == 0 {
				return
			}
			if p := r.part(fp.Partition); p != nil {
				p.highWatermark.Store(fp.HighWatermark)
				p.pushCommands(fp.Records)
			}
		})
	}
}

// lag is how many commands of the owned partitions wait to be applied.
func (r *Replica) lag() map[string]int64 {
	var n int64
	for _, p := range r.owned() {
		n += max(p.highWatermark.Load()-p.cmdNext.Load(), 0)
	}
	return map[string]int64{kafka.CommandsTopic: n}
}

// observePartitions reports each owned partition's payload bytes and queued
// tasks.
func (r *Replica) observePartitions(_ context.Context, o metric.Observer) error {
	for _, p := range r.owned() {
		part := attribute.Int("partition", int(p.id))
		o.ObserveInt64(r.payloadBytes, p.payloadBytes.Load(), metric.WithAttributes(part))
		o.ObserveInt64(r.queuedTasks, p.queuedHeld.Load(), metric.WithAttributes(part, attribute.Bool("held", true)))
		o.ObserveInt64(r.queuedTasks, p.queuedCold.Load(), metric.WithAttributes(part, attribute.Bool("held", false)))
	}
	return nil
}

// Close makes waiting claims return what they have (nothing) at once.
func (r *Replica) Close() { r.closeOnce.Do(func() { close(r.closing) }) }

func (r *Replica) part(id int32) *partition {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.parts[id]
}

// owned lists the partitions this replica runs.
func (r *Replica) owned() []*partition {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*partition, 0, len(r.parts))
	for _, p := range r.parts {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *partition) int { return int(a.id - b.id) })
	return out
}

// Owns reports whether this replica runs partition id.
func (r *Replica) Owns(id int32) bool { return r.part(id) != nil }

// OwnedPartitions lists the partitions this replica runs.
func (r *Replica) OwnedPartitions() []int32 {
	ps := r.owned()
	out := make([]int32, len(ps))
	for i, p := range ps {
		out[i] = p.id
	}
	return out
}

func (r *Replica) assigned(_ context.Context, group *kgo.Client, assigned map[string][]int32) {
	ids := assigned[kafka.CommandsTopic]
	if len(ids) == 0 {
		return
	}
	r.mu.Lock()
	ctx := r.ctx
	for _, id := range ids {
		if r.parts[id] != nil {
			continue
		}
		p := newPartition(r, id, func() (*producer, error) { return r.newProducer(id) })
		r.parts[id] = p
		p.start(ctx)
	}
	r.mu.Unlock()
	r.log.Info("partitions assigned", "partitions", ids)
	// From the callback's client: the group may assign partitions before
	// Run has stored its client.
	member, _ := group.GroupMetadata()
	go r.publishOwners(ctx, member)
}

func (r *Replica) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	ids := revoked[kafka.CommandsTopic]
	var stopping []*partition
	r.mu.Lock()
	for _, id := range ids {
		if p := r.parts[id]; p != nil {
			stopping = append(stopping, p)
			delete(r.parts, id)
		}
	}
	r.mu.Unlock()
	r.stop(stopping)
	if len(stopping) > 0 {
		r.log.Info("partitions revoked", "partitions", ids)
	}
}

func (r *Replica) stopAll() {
	r.mu.Lock()
	ps := make([]*partition, 0, len(r.parts))
	for id, p := range r.parts {
		ps = append(ps, p)
		delete(r.parts, id)
	}
	r.mu.Unlock()
	r.stop(ps)
}

// stop ends partitions in parallel, each finishing its batch.
func (r *Replica) stop(ps []*partition) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(p.stop)
	}
	wg.Wait()
}

// publishOwners writes which partitions this replica owns, as group member,
// for gateways and peers to route by; it retries while Postgres is away.
func (r *Replica) publishOwners(ctx context.Context, member string) {
	_ = retry.Do(ctx, ownersRetry, func() error {
		return view.SetOwners(ctx, r.pool, r.cfg.ReplicaID, r.cfg.Address, member, r.OwnedPartitions())
	}, func(err error, attempt int, next time.Duration) {
		r.log.WarnContext(ctx, "publishing partition owners failed; retrying", "attempt", attempt, "retry_in", next, "error", err)
	})
}

// stillOwns asks the group coordinator whether this replica's member is
// assigned partition id now. A replica paused past its session learns here
// that it lost the partition before its own heartbeat tells it.
func (r *Replica) stillOwns(ctx context.Context, id int32) (bool, error) {
	member, _ := r.group.GroupMetadata()
	groups, err := kadm.NewClient(r.admin).DescribeGroups(ctx, kafka.DispatcherGroup)
	if err != nil {
		return false, fmt.Errorf("describe group %s: %w", kafka.DispatcherGroup, err)
	}
	g, ok := groups[kafka.DispatcherGroup]
	if !ok || g.Err != nil {
		return false, fmt.Errorf("describe group %s: %v", kafka.DispatcherGroup, g.Err)
	}
	for _, m := range g.Members {
		if m.MemberID != member {
			continue
		}
		c, ok := m.Assigned.AsConsumer()
		if !ok {
			return false, nil
		}
		for _, t := range c.Topics {
			if t.Topic == kafka.CommandsTopic && slices.Contains(t.Partitions, id) {
				return true, nil
			}
		}
	}
	return false, nil
}

// viewReached is the materializer's callback.
func (r *Replica) viewReached(partition int32, offset int64) {
	if p := r.part(partition); p != nil {
		p.viewReached(offset)
	}
}

// readSnapshot runs fn in a repeatable-read transaction, so the view's
// offsets and its tasks are read as of one moment.
func (r *Replica) readSnapshot(ctx context.Context, fn func(pgx.Tx) error) error {
	return pg.InTxWith(ctx, r.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

// poison dead-letters a command no partition can apply.
func (r *Replica) poison(ctx context.Context, rec *kgo.Record, err error) {
	r.dlq.DeadLetter(ctx, rec, err)
}
