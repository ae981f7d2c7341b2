package tally_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	"github.com/razorbill/flo/services/registry/internal/store"
	"github.com/razorbill/flo/services/registry/internal/tally"
)

func TestOutcomeOf(t *testing.T) {
	t.Parallel()
	want := map[eventsv1.TaskEventType]tally.Outcome{
		eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED:       tally.Succeeded,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED:          tally.Failed,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_RETRY_SCHEDULED: tally.Failed,
		eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED:   tally.Failed,
	}
	for v := range eventsv1.TaskEventType_name {
		typ := eventsv1.TaskEventType(v)
		require.Equal(t, want[typ], tally.OutcomeOf(typ), typ.String())
	}
}

func TestAggregate(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	events := []tally.Event{
		{Outcome: tally.Succeeded, Namespace: "b", WorkerID: "w", Action: "x", OccurredAt: t0.Add(2 * time.Second)},
		{Outcome: tally.Failed, Namespace: "a", WorkerID: "w", Action: "y", OccurredAt: t0},
		{Outcome: tally.Succeeded, Namespace: "b", WorkerID: "w", Action: "x", OccurredAt: t0},
		{Outcome: tally.Failed, Namespace: "b", WorkerID: "w", Action: "x", OccurredAt: t0.Add(time.Second)},
		{Outcome: tally.Succeeded, Namespace: "a", WorkerID: "v", OccurredAt: t0},
	}
	workers, processes := tally.Aggregate(events)
	require.Equal(t, []store.WorkerCount{
		{Namespace: "a", WorkerID: "v", Completed: 1},
		{Namespace: "a", WorkerID: "w", Failed: 1},
		{Namespace: "b", WorkerID: "w", Completed: 2, Failed: 1},
	}, workers)
	require.Equal(t, []store.ProcessCount{
		{Namespace: "a", WorkerID: "w", Name: "y", Fails: 1, LastRunAt: t0},
		{Namespace: "b", WorkerID: "w", Name: "x", Runs: 2, Fails: 1, LastRunAt: t0.Add(2 * time.Second)},
	}, processes)
}
