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
		var items []json.RawMessage
		if err := json.Unmarshal(run.Input, &items); err != nil || len(items) != len(t.Records) {
			return false, fmt.Errorf("trigger batch input of %d records is not an array of as many payloads", len(t.Records))
		}
		kept := items[:0]
		for i, id := range t.Records {
			if claimed[id] {
				kept = append(kept, items[i])
			}
		}
		if run.Input, err = json.Marshal(kept); err != nil {
			return false, fmt.Errorf("trigger batch input: %w", err)
		}
	}
	run.TriggerRecord = first
	run.IdempotencyKey = TriggerKey(stream, first)
	return true, nil
}
