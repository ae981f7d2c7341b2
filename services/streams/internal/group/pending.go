package group

import (
	"context"
	"strconv"
	"time"

	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/libs/text"
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

// Pending lists a page of a group's pending records (of one consumer when
// consumer is not empty) by partition and offset, how many there are in
// all, and the token of the next page.
//
// The page token is the partition and offset of the page's last record.
// Ranges are read by their (partition, offset) key, so a page costs an index
// scan whatever page it is.
func (g *Groups) Pending(ctx context.Context, key store.GroupKey, consumer string, p page.Page) ([]Entry, int64, string, error) {
	after := store.Target{Partition: -1, Offset: -1}
	if p.After != nil {
		part, err := p.Int(0)
		if err != nil {
			return nil, 0, "", err
		}
		if after.Offset, err = p.Int(1); err != nil {
			return nil, 0, "", err
		}
		after.Partition = int32(part)
	}
	if consumer != "" {
		if err := text.WorkerID("consumer", consumer); err != nil {
			return nil, 0, "", err
		}
	}
	grp, err := g.catalog.GetGroup(ctx, key)
	if err != nil {
		return nil, 0, "", err
	}
	// A range holds at least one pending record, so a page's worth of
	// ranges fills a page unless the list ends.
	ranges, total, err := store.ListPending(ctx, g.pool, grp.Group.ID, consumer, after, p.Limit)
	if err != nil {
		return nil, 0, "", err
	}
	var out []Entry
	for _, r := range ranges {
		for _, off := range r.Open() {
			if r.Partition == after.Partition && off <= after.Offset {
				continue
			}
			out = append(out, Entry{
				ID:            record.NewID(r.Stamp(off), r.Partition, off),
				Consumer:      r.Consumer,
				DeliveryCount: r.Deliveries,
				DeliveredAt:   r.DeliveredAt,
				RedeliverAt:   r.RedeliverAt,
			})
			after.Partition, after.Offset = r.Partition, off
		}
	}
	if len(out) > p.Limit {
		out = out[:p.Limit]
		last := out[len(out)-1].ID
		after.Partition, after.Offset = last.Partition(), last.Offset()
	} else if len(ranges) < p.Limit {
		return out, total, "", nil
	} else if len(out) == 0 {
		// Every open record of the one range read was on the previous page.
		last := ranges[len(ranges)-1]
		after.Partition, after.Offset = last.Partition, last.Last
	}
	return out, total, page.Token(strconv.Itoa(int(after.Partition)), strconv.FormatInt(after.Offset, 10)), nil
}
