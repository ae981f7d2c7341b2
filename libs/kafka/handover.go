package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/retry"
)

const (
	// DispatcherGroup is the dispatcher replicas' consumer group on
	// CommandsTopic.
	DispatcherGroup = "flo-dispatcher"
	// DispatcherClientID is the client id a dispatcher replica joins
	// DispatcherGroup with. It marks a replica that writes
	// TaskOutcomesTopic: replicas of the versions before that topic joined
	// with franz-go's default client id and wrote the outcomes only into
	// TaskEventsTopic.
	DispatcherClientID = "flo-dispatcher"
)

// writersPoll spaces the looks at DispatcherGroup while a dispatcher of an
// earlier version is in it: an upgrade's pace, not a task's.
const writersPoll = time.Second

// leftOverRetry paces the reads of the group's offsets while the broker is
// away.
var leftOverRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// TakeOverTaskOutcomes readies a Consumer of TaskOutcomesTopic whose group
// read the task outcomes from TaskEventsTopic before (the versions before
// the outcomes topic). Before its group joins, Run waits until every member
// of DispatcherGroup writes the outcomes topic (a reader of it would miss
// what the others end); then, at the group's first start on its topics, it
// hands its handler what is left of TaskEventsTopic from the group's
// committed offsets there to that topic's end, so the outcomes the earlier
// dispatchers wrote after the group's earlier version stopped reach it too.
// Records of that range a dispatcher of this version wrote come again from
// the outcomes topic; the handlers are idempotent, as a redelivery needs.
// Call it before Run.
func (c *Consumer) TakeOverTaskOutcomes() {
	c.takeOver = true
	c.handover.Store(new("looking for dispatchers of an earlier version in group " + DispatcherGroup))
}

// HandedOver is a readiness check: an error while Run waits for
// dispatchers of an earlier version or hands over what they left
// (TakeOverTaskOutcomes), nil otherwise.
func (c *Consumer) HandedOver(context.Context) error {
	if why := c.handover.Load(); why != nil {
		return fmt.Errorf("%s: %s", c.group, *why)
	}
	return nil
}

// takeOverTaskOutcomes is TakeOverTaskOutcomes's part of Run.
func (c *Consumer) takeOverTaskOutcomes(ctx context.Context) error {
	adm := kadm.NewClient(c.cl)
	if err := c.awaitOutcomeWriters(ctx, adm); err != nil {
		return err
	}
	var left map[int32]offsets
	err := retry.Do(ctx, leftOverRetry, func() (err error) {
		left, err = c.leftOver(ctx, adm)
		return err
	}, func(err error, _ int, next time.Duration) {
		c.log.WarnContext(ctx, "task events left to hand over cannot be read; trying again", "error", err, "next", next)
	})
	if err != nil {
		return err
	}
	if len(left) > 0 {
		c.handover.Store(new("handling what is left of " + TaskEventsTopic))
		c.log.InfoContext(ctx, "handling the task outcomes left in the task events topic", "topic", TaskEventsTopic, "partitions", len(left))
		if err := c.handleLeftOver(ctx, left); err != nil {
			return err
		}
	}
	c.handover.Store(nil)
	return nil
}

// awaitOutcomeWriters returns once every member of DispatcherGroup writes
// TaskOutcomesTopic, or the group has no member, or ctx ends.
func (c *Consumer) awaitOutcomeWriters(ctx context.Context, adm *kadm.Client) error {
	t := time.NewTicker(writersPoll)
	defer t.Stop()
	var waited string
	for {
		earlier, err := earlierDispatchers(ctx, adm)
		switch {
		case err != nil && ctx.Err() == nil:
			c.log.WarnContext(ctx, "dispatcher group cannot be described; trying again", "group", DispatcherGroup, "error", err)
		case err == nil && len(earlier) == 0:
			if waited != "" {
				c.log.InfoContext(ctx, "every dispatcher writes the task outcomes", "group", DispatcherGroup)
			}
			return nil
		case err == nil && strings.Join(earlier, ", ") != waited:
			waited = strings.Join(earlier, ", ")
			why := fmt.Sprintf("waiting for the dispatchers of an earlier version (%d: %s), which write no task outcomes, to leave group %s: upgrade them",
				len(earlier), waited, DispatcherGroup)
			c.handover.Store(&why)
			c.log.WarnContext(ctx, why, "group", DispatcherGroup)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// earlierDispatchers returns the hosts of DispatcherGroup's members that
// joined without DispatcherClientID.
func earlierDispatchers(ctx context.Context, adm *kadm.Client) ([]string, error) {
	members, err := DispatcherMembers(ctx, adm)
	if err != nil {
		return nil, err
	}
	var earlier []string
	for _, m := range members {
		if m.ClientID != DispatcherClientID {
			earlier = append(earlier, m.ClientHost)
		}
	}
	slices.Sort(earlier)
	return earlier, nil
}

// DispatcherMembers returns the members of DispatcherGroup, none when the
// group does not exist.
func DispatcherMembers(ctx context.Context, adm *kadm.Client) ([]kadm.DescribedGroupMember, error) {
	groups, err := adm.DescribeGroups(ctx, DispatcherGroup)
	if err != nil {
		return nil, fmt.Errorf("describe group %s: %w", DispatcherGroup, err)
	}
	g := groups[DispatcherGroup]
	if g.Err != nil && !errors.Is(g.Err, kerr.GroupIDNotFound) {
		return nil, fmt.Errorf("describe group %s: %w", DispatcherGroup, g.Err)
	}
	return g.Members, nil
}

// offsets is a range of a partition's offsets, end excluded.
type offsets struct{ from, end int64 }

// leftOver returns, by partition, the range of TaskEventsTopic the group
// has not handled: from its committed offset to the topic's end. It is
// empty once the group committed an offset of its own topics (an earlier
// start handed over already) or never read TaskEventsTopic.
func (c *Consumer) leftOver(ctx context.Context, adm *kadm.Client) (map[int32]offsets, error) {
	committed, err := adm.FetchOffsets(ctx, c.group)
	if err == nil {
		err = committed.Error()
	}
	switch {
	case errors.Is(err, kerr.GroupIDNotFound):
		// A new group: nothing was read before.
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("fetch offsets of group %s: %w", c.group, err)
	}
	for _, t := range c.topics {
		if len(committed[t]) > 0 {
			return nil, nil
		}
	}
	if len(committed[TaskEventsTopic]) == 0 {
		return nil, nil
	}
	ends, err := adm.ListEndOffsets(ctx, TaskEventsTopic)
	if err != nil {
		return nil, fmt.Errorf("list end offsets of %s: %w", TaskEventsTopic, err)
	}
	if err := ends.Error(); err != nil {
		return nil, fmt.Errorf("list end offsets of %s: %w", TaskEventsTopic, err)
	}
	left := map[int32]offsets{}
	for p, o := range committed[TaskEventsTopic] {
		end, ok := ends.Lookup(TaskEventsTopic, p)
		if ok && o.At >= 0 && o.At < end.Offset {
			left[p] = offsets{from: o.At, end: end.Offset}
		}
	}
	return left, nil
}

// handleLeftOver hands the handler the records of each partition's range,
// reading committed transactions only, as the group did.
func (c *Consumer) handleLeftOver(ctx context.Context, left map[int32]offsets) error {
	starts := make(map[int32]kgo.Offset, len(left))
	for p, r := range left {
		starts[p] = kgo.NewOffset().At(r.from)
	}
	cl, err := NewClient(c.conn,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{TaskEventsTopic: starts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A range may end with a transaction marker: seeing it says the
		// range was read.
		kgo.KeepControlRecords())
	if err != nil {
		return fmt.Errorf("read what is left of %s: %w", TaskEventsTopic, err)
	}
	defer cl.Close()
	for len(left) > 0 {
		fetches := cl.PollRecords(ctx, maxPollRecords)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		logFetchErrors(ctx, c.log, fetches)
		var failed bool
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			r, ok := left[p.Partition]
			if failed || !ok || len(p.Records) == 0 {
				return
			}
			// Past the range's end are records of dispatchers of this
			// version, which the outcomes topic brings.
			in := p.Records
			if i := slices.IndexFunc(in, func(rec *kgo.Record) bool { return rec.Offset >= r.end }); i >= 0 {
				in = in[:i]
			}
			if data := withoutControl(in); len(data) > 0 && !c.h.handle(ctx, data) {
				failed = true
				return
			}
			if p.Records[len(p.Records)-1].Offset+1 >= r.end {
				delete(left, p.Partition)
				cl.PauseFetchPartitions(map[string][]int32{TaskEventsTopic: {p.Partition}})
			}
		})
		if failed {
			return ctx.Err()
		}
	}
	return nil
}
