package group

import (
	"context"
	"slices"
	"time"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/streams/internal/record"
	"github.com/razorbill/flo/services/streams/internal/store"
)

// Entry is one record handed out and not settled.
type Entry struct {
	ID            record.ID
	Consumer      string
	DeliveryCount int
	DeliveredAt   time.Time
	RedeliverAt   time.Time
}

// Pending lists up to limit of a group's pending records (of one consumer
// when consumer is not empty), oldest first, and how many there are in all.
func (g *Groups) Pending(ctx context.Context, key store.GroupKey, consumer string, limit int) ([]Entry, int64, error) {
	switch {
	case limit < 0:
		return nil, 0, fault.Invalidf("limit must not be negative, got %d", limit)
	case limit == 0:
		limit = DefaultPendingLimit
	}
	limit = min(limit, MaxPendingLimit)
	grp, err := g.catalog.GetGroup(ctx, key)
	if err != nil {
		return nil, 0, err
	}
	ranges, total, err := store.ListPending(ctx, g.pool, grp.Group.ID, consumer, limit)
	if err != nil {
		return nil, 0, err
	}
	var out []Entry
	for _, r := range ranges {
		for _, off := range r.Open() {
			out = append(out, Entry{
				ID:            record.NewID(r.Stamp(off), r.Partition, off),
				Consumer:      r.Consumer,
				DeliveryCount: r.Deliveries,
				DeliveredAt:   r.DeliveredAt,
				RedeliverAt:   r.RedeliverAt,
			})
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return a.ID.Compare(b.ID) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, total, nil
}
