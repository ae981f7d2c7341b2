package engine

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// eventOf encodes c and reads back the TaskEvent other services see.
func eventOf(t *testing.T, c Change) *eventsv1.TaskEvent {
	t.Helper()
	recs, _, err := EncodeAll([]Change{c}, 0, 0)
	require.NoError(t, err)
	rec := recs[0]
	var ev eventsv1.TaskEvent
	require.NoError(t, proto.Unmarshal(rec.Value, &ev))
	return &ev
}

// A task whose last attempt ran out of time says so on its final event, which
// is what lets a workflow step take its timeout transition.
func TestEventCarriesTimedOut(t *testing.T) {
	t.Parallel()
	for _, timedOut := range []bool{true, false} {
		task := Task{ID: uuid.New(), Namespace: "ns", Action: "a", Status: store.DeadLettered, Attempt: 2,
			Error: "lease expired", TimedOut: timedOut, Origin: "workflow:run-1/1"}
		ev := eventOf(t, Change{Type: taskevent.DeadLettered, Task: task})
		require.Equal(t, eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED, ev.GetType())
		require.Equal(t, timedOut, ev.GetTimedOut())
		require.False(t, ev.GetNonRetryable())
	}
}

// A failed task's error code rides on its event, for the workflow that
// invoked it, and a FAILED event is final for the workflow.
func TestEventCarriesErrorCode(t *testing.T) {
	t.Parallel()
	task := Task{ID: uuid.New(), Namespace: "ns", Action: "a", Status: store.Failed, Attempt: 1,
		Error: "declined", ErrorCode: "card_declined", Origin: "workflow:run-1/1"}
	ev := eventOf(t, Change{Type: taskevent.Failed, Task: task})
	require.Equal(t, "card_declined", ev.GetErrorCode())
	require.Equal(t, "declined", ev.GetError())
	require.True(t, ev.GetNonRetryable())
}
