package taskevent

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// A task whose last attempt ran out of time says so on its final event, which
// is what lets a workflow step take its timeout transition.
func TestRecordCarriesTimedOut(t *testing.T) {
	t.Parallel()
	for _, timedOut := range []bool{true, false} {
		c := store.Change{ID: uuid.New(), Namespace: "ns", Action: "a", Status: store.DeadLettered, Attempt: 2,
			Error: "lease expired", TimedOut: timedOut, Origin: "workflow:run-1/1"}
		rec, err := Record(DeadLettered, c, time.Now())
		require.NoError(t, err)
		var ev eventsv1.TaskEvent
		require.NoError(t, proto.Unmarshal(rec.Value, &ev))
		require.Equal(t, eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED, ev.GetType())
		require.Equal(t, timedOut, ev.GetTimedOut())
		require.False(t, ev.GetNonRetryable())
	}
}

// A failed task's error code rides on its event, for the workflow that
// invoked it.
func TestRecordCarriesErrorCode(t *testing.T) {
	t.Parallel()
	c := store.Change{ID: uuid.New(), Namespace: "ns", Action: "a", Status: store.Failed, Attempt: 1,
		Error: "declined", ErrorCode: "card_declined", Origin: "workflow:run-1/1"}
	rec, err := Record(Failed, c, time.Now())
	require.NoError(t, err)
	var ev eventsv1.TaskEvent
	require.NoError(t, proto.Unmarshal(rec.Value, &ev))
	require.Equal(t, "card_declined", ev.GetErrorCode())
	require.Equal(t, "declined", ev.GetError())
}
