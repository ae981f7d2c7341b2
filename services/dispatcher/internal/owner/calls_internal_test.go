package owner

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// A requeue or a completion of a task the partition let go loads the view's
// row only if the view had every offset the partition knew it to hold when
// the row was read. A row read just before the task's last state reached
// the view (here: it was dead-lettered, then requeued, completed and let
// go) would bring the dead letter back to run again; it is refused as
// stale, and the caller reads again.
func TestARowReadBeforeTheViewHadTheLastStateIsNotLoaded(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	p := &partition{eng: engine.New(0)}
	p.materialized.Store(10) // the completion, at offset 10, is in the view
	dead := engine.Task{ID: uuid.New(), Namespace: "ns", Action: "a", Status: store.DeadLettered, Payload: []byte(`{}`),
		Attempt: 1, Settings: store.Settings{Timeout: time.Second, MaxAttempts: 1}, CreatedAt: now, RunAt: now,
		UpdatedAt: now, FinishedAt: now}
	completed := dead
	completed.Status, completed.Attempt = store.Completed, 2

	requeue := func(row engine.Task, viewed int64) *requeueOp {
		o := &requeueOp{ns: "ns", id: dead.ID, load: &viewRow{row, viewed}}
		o.apply(p, now, nil)
		return o
	}
	o := requeue(dead, 9)
	require.ErrorIs(t, o.err, errStaleView)
	require.False(t, p.eng.Has(dead.ID), "the stale row is not held")

	o = requeue(completed, 10)
	kind, _, ok := fault.KindOf(o.err)
	require.True(t, ok && kind == fault.Precondition, "the completed task is not requeued: %v", o.err)

	tok := engine.Token{ID: dead.ID}
	f := &finishOp{ns: "ns", tok: tok, load: &viewRow{dead, 9}}
	p2 := &partition{eng: engine.New(0)}
	p2.materialized.Store(10)
	f.apply(p2, now, nil)
	require.ErrorIs(t, f.err, errStaleView)
	require.False(t, p2.eng.Has(dead.ID))
}
