package owner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/dispatcher/internal/view"
)

// Repartitioned is what Repartition did.
type Repartitioned struct {
	// From and To are the partition counts before and after.
	From, To int32
	// Written is how many task states of the log the view did not have
	// yet, written before the rows moved; Moved how many rows moved to
	// another partition.
	Written, Moved int
}

// Repartition raises the partition count of the task topics to n, while no
// replica runs (the dispatchers' group has no member; it refuses
// otherwise). Task ids fall in partitions by their hash modulo the count,
// so most move: n is recorded as the view's count, which replicas of the
// old count then refuse, every old partition's transactional id is taken,
// the view is brought up to the end of every events partition, its rows
// move to their partitions of n in one transaction, and then the three
// topics grow to n (the outcomes topic is made with n if no dispatcher made
// it yet). Replicas
// started after it rebuild from the view alone, and the commands still
// waiting in an old partition, or sent there by a producer that has not
// seen the new count yet, are moved to their task's partition by its
// owner (see intake). A run cut short is finished by running it again:
// replicas refuse to start while the view's count and the topics' differ.
// Fewer partitions are refused: Kafka cannot remove any.
func Repartition(ctx context.Context, conn config.Kafka, pool *pgxpool.Pool, log *slog.Logger, n int32) (Repartitioned, error) {
	if n < 1 {
		return Repartitioned{}, fault.Invalidf("the partition count must be at least 1, got %d", n)
	}
	// A client that creates no topic: one missing is refused below.
	admin, err := kafka.NewManagedTopicsClient(conn)
	if err != nil {
		return Repartitioned{}, fmt.Errorf("kafka client: %w", err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	topics := []string{kafka.CommandsTopic, kafka.TaskEventsTopic, kafka.TaskOutcomesTopic}
	details, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return Repartitioned{}, fmt.Errorf("describe task topics: %w", err)
	}
	counts := map[string]int32{}
	for _, t := range topics {
		if errors.Is(details[t].Err, kerr.UnknownTopicOrPartition) {
			if t == kafka.TaskOutcomesTopic {
				// Made by dispatchers since the outcomes came: one
				// that never ran here is made below, with n.
				continue
			}
			return Repartitioned{}, fault.Preconditionf("topic %s does not exist: a dispatcher creates the task topics with FLO_KAFKA_PARTITIONS partitions", t)
		}
		if details[t].Err != nil {
			return Repartitioned{}, fmt.Errorf("describe topic %s: %w", t, details[t].Err)
		}
		counts[t] = int32(len(details[t].Partitions))
		if counts[t] > n {
			return Repartitioned{}, fault.Preconditionf("topic %s has %d partitions; a partition count can only grow", t, counts[t])
		}
	}
	layout, err := view.Layout(ctx, pool)
	if err != nil {
		return Repartitioned{}, err
	}
	if layout > n {
		return Repartitioned{}, fault.Preconditionf("the task view is keyed by %d partitions; a partition count can only grow", layout)
	}
	// The old count is the topics': a run cut short may have grown one of
	// them, whose new partitions are empty.
	out := Repartitioned{From: min(counts[kafka.CommandsTopic], counts[kafka.TaskEventsTopic]), To: n}
	if out.From == n && layout == n && counts[kafka.TaskOutcomesTopic] == n {
		return out, nil
	}
	if err := requireNoReplica(ctx, adm); err != nil {
		return out, err
	}
	// Recorded first: from here a replica of the old count (one paused
	// past its session, so out of the group, that wakes now) refuses to
	// rebuild a partition, and the view refuses its writes. One that took
	// a partition's id before is fenced next, and cannot take it again.
	if err := view.RecordLayout(ctx, pool, n); err != nil {
		return out, err
	}
	if err := fenceOwners(ctx, conn, out.From); err != nil {
		return out, err
	}
	if out.Written, err = catchUp(ctx, conn, admin, pool, log, out.From, n); err != nil {
		return out, err
	}
	err = pg.InTx(ctx, pool, func(tx pgx.Tx) error {
		out.Moved, err = view.Rekey(ctx, tx, n, func(id string) int32 { return kafka.PartitionOf(id, n) })
		return err
	})
	if err != nil {
		return out, fmt.Errorf("key the view by %d partitions: %w", n, err)
	}
	log.InfoContext(ctx, "task view keyed by the new partition count", "partitions", n, "written", out.Written, "moved", out.Moved)
	for _, t := range topics {
		if counts[t] == n {
			continue
		}
		if counts[t] == 0 {
			if err := kafka.EnsureTopics(ctx, admin, n, t); err != nil {
				return out, err
			}
			continue
		}
		resp, err := adm.UpdatePartitions(ctx, int(n), t)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			return out, fmt.Errorf("grow topic %s to %d partitions: %w", t, n, err)
		}
		log.InfoContext(ctx, "task topic grown", "topic", t, "partitions", n)
	}
	return out, nil
}

// requireNoReplica refuses while the dispatchers' group has members: a
// replica running on the old count would own, and write, partitions whose
// tasks are moving.
func requireNoReplica(ctx context.Context, adm *kadm.Client) error {
	members, err := kafka.DispatcherMembers(ctx, adm)
	if err != nil {
		return err
	}
	if len(members) > 0 {
		hosts := make([]string, len(members))
		for i, m := range members {
			hosts[i] = m.ClientHost
		}
		return fault.Preconditionf("%d dispatcher replicas are running (%v): stop every one first", len(members), hosts)
	}
	return nil
}

// fenceOwners takes the transactional id of each of the n partitions, as a
// new owner does: a transaction that a replica of the old count left open
// (one paused past its session, which the group no longer lists) is
// aborted, and that replica cannot commit again. The catch-up after it so
// reads every state that can ever be committed under the old count.
func fenceOwners(ctx context.Context, conn config.Kafka, n int32) error {
	for id := range n {
		cl, err := kafka.NewClient(conn, transactional(id)...)
		if err != nil {
			return fmt.Errorf("kafka client: %w", err)
		}
		_, _, err = cl.ProducerID(ctx)
		cl.Close()
		if err != nil {
			return fmt.Errorf("fence the owners of partition %d: %w", id, err)
		}
	}
	return nil
}

// catchUp writes into the view every committed state of events partitions
// 0 to n-1 it does not have yet, so that after the rows move no replica
// replays a record of the old count. The view is keyed by to already (the
// rows move next). It returns how many it wrote.
func catchUp(ctx context.Context, conn config.Kafka, admin *kgo.Client, pool *pgxpool.Pool, log *slog.Logger, n, to int32) (int, error) {
	mat, err := view.NewMaterializer(pool, to, log, noop.NewMeterProvider().Meter(""), nil)
	if err != nil {
		return 0, err
	}
	written := 0
	for id := range n {
		from, _, err := view.Offsets(ctx, pool, id)
		if err != nil {
			return written, err
		}
		events, err := readEvents(ctx, conn, admin, id, from, log)
		if err != nil {
			return written, fmt.Errorf("read events partition %d: %w", id, err)
		}
		mat.Add(events.entries...)
		written += len(events.entries)
	}
	if err := mat.Flush(ctx); err != nil {
		return written, fmt.Errorf("write the task view: %w", err)
	}
	if left := mat.Lag(); left > 0 {
		return written, fmt.Errorf("%d task states were refused by the task view (logged): fix their cause and run again", left)
	}
	return written, nil
}
