package tally

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// HandleTogether counts the records of several partitions' polls in one
// transaction, as the batches of concurrent HandleRecords calls are when
// they queue behind one another.
func (t *Tally) HandleTogether(ctx context.Context, polls ...[]*kgo.Record) error {
	batches := make([]batch, len(polls))
	for i, records := range polls {
		batches[i], _ = batchOf(records)
	}
	return t.apply(ctx, batches)
}
