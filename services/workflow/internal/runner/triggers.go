package runner

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// TriggerStart is what a stream trigger's start carries: the records the run
// starts for.
type TriggerStart struct {
	StreamNamespace, Stream string
	// Records are the records' ids; with Batch, the input is the array of
	// their payloads in this order.
	Records []string
	Batch   bool
}

// TriggerKey is the idempotency key of a run a trigger started, named by
// the run's first record in the stream NAMESPACE/STREAM:
// trigger:NAMESPACE/STREAM/ID. It is shown, not looked up: the records are
// what make such starts idempotent. It may be longer than a client's key.
func TriggerKey(stream, recordID string) string {
	return "trigger:" + stream + "/" + recordID
}

// claimTrigger makes run the run of those of its start's records no run has
// yet, with only their payloads in a batch's input. When every record has a
// run already, it answers the call with the first record's run and returns
// false.
func (u *unit) claimTrigger(ctx context.Context, c *coalesce.Call[StartRequest, StartResult], run *store.Run) (bool, error) {
	t := c.Req.Trigger
	stream := t.StreamNamespace + "/" + t.Stream
	recs := store.TriggerRecords{Namespace: c.Req.Namespace, Workflow: c.Req.Workflow, Stream: stream, IDs: t.Records}
	claimed, err := store.ClaimTriggerRecords(ctx, u.tx, recs, run.ID)
	if err != nil {
		return false, err
	}
	if len(claimed) == 0 {
		id, err := store.TriggerRun(ctx, u.tx, c.Req.Namespace, c.Req.Workflow, stream, t.Records[0])
		c.Resp = StartResult{RunID: id}
		return false, err
	}
	var first string
	for _, id := range t.Records {
		if claimed[id] {
			first = id
			break
		}
	}
	if t.Batch && len(claimed) < len(t.Records) {
		if run.Input, err = keepClaimed(run.Input, t.Records, claimed); err != nil {
			return false, err
		}
	}
	run.TriggerRecord = first
	run.IdempotencyKey = TriggerKey(stream, first)
	return true, nil
}

// keepClaimed returns a batch's input, the array of records' payloads, with
// only the payloads of the claimed records.
func keepClaimed(input json.RawMessage, records []string, claimed map[string]bool) (json.RawMessage, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(input, &items); err != nil || len(items) != len(records) {
		return nil, fmt.Errorf("trigger batch input of %d records is not an array of as many payloads", len(records))
	}
	kept := items[:0]
	for i, id := range records {
		if claimed[id] {
			kept = append(kept, items[i])
		}
	}
	out, err := json.Marshal(kept)
	if err != nil {
		return nil, fmt.Errorf("trigger batch input: %w", err)
	}
	return out, nil
}
