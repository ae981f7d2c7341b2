package runner

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	"github.com/razorbill/flo/services/workflow/internal/engine"
)

// A failed or dead-lettered task that ran out of time reaches the engine as
// timed out; other ends do not.
func TestTaskEndedCarriesTimedOut(t *testing.T) {
	t.Parallel()
	runID := uuid.NewString()
	origin := engine.Origin(runID, "3")
	tests := []struct {
		name string
		ev   *eventsv1.TaskEvent
		want any
	}{
		{name: "failed after its handler's deadline",
			ev:   &eventsv1.TaskEvent{Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED, Origin: origin, Error: "context deadline exceeded", NonRetryable: true, TimedOut: true},
			want: engine.TaskEnded{Token: "3", Outcome: "failure", Error: "context deadline exceeded", NonRetryable: true, TimedOut: true}},
		{name: "dead-lettered after its lease expired",
			ev:   &eventsv1.TaskEvent{Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED, Origin: origin, Error: "lease expired", TimedOut: true},
			want: engine.TaskEnded{Token: "3", Outcome: "failure", Error: "lease expired", TimedOut: true}},
		{name: "failed with an error code",
			ev:   &eventsv1.TaskEvent{Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED, Origin: origin, Error: "declined", NonRetryable: true, ErrorCode: "card_declined"},
			want: engine.TaskEnded{Token: "3", Outcome: "failure", Error: "declined", NonRetryable: true, ErrorCode: "card_declined"}},
		{name: "dead-lettered with an error code",
			ev:   &eventsv1.TaskEvent{Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED, Origin: origin, Error: "busy", ErrorCode: "rate_limited"},
			want: engine.TaskEnded{Token: "3", Outcome: "failure", Error: "busy", ErrorCode: "rate_limited"}},
		{name: "an ordinary failure",
			ev:   &eventsv1.TaskEvent{Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED, Origin: origin, Error: "boom"},
			want: engine.TaskEnded{Token: "3", Outcome: "failure", Error: "boom"}},
		{name: "a result pending by completion token",
			ev:   &eventsv1.TaskEvent{Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_WAITING, Origin: origin},
			want: engine.TaskWaiting{Token: "3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := taskEnded(tt.ev)
			require.True(t, ok)
			require.Equal(t, runID, got.runID)
			require.Equal(t, "3", got.token)
			require.Equal(t, tt.want, got.ev)
		})
	}
}
