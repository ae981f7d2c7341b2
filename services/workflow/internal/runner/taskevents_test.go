package runner

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"

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

// fromRun tells a run's task events from others by the origin field alone,
// and leaves what is not a well-formed message to the full decode.
func TestFromRunReadsTheOriginAlone(t *testing.T) {
	t.Parallel()
	encode := func(ev *eventsv1.TaskEvent) []byte {
		b, err := ev.MarshalVT()
		require.NoError(t, err)
		return b
	}
	ofRun := encode(&eventsv1.TaskEvent{TaskId: "t", Origin: engine.Origin(uuid.NewString(), "1"), State: []byte("state"), Error: "e"})
	plain := encode(&eventsv1.TaskEvent{TaskId: "t", State: []byte("state"), Attempt: 2})
	other := encode(&eventsv1.TaskEvent{TaskId: "t", Origin: "cron:nightly"})
	// A repeated field decodes to its last value.
	lastOfRun := append(append([]byte{}, other...), ofRun...)
	lastOther := append(append([]byte{}, ofRun...), other...)
	// Field 13 (origin) with wire type 5 (fixed32), and a cut message.
	wrongType := append(append([]byte{}, plain...), protowire.AppendTag(nil, originNumber, protowire.Fixed32Type)...)
	wrongType = protowire.AppendFixed32(wrongType, 7)
	cut := ofRun[:len(ofRun)-3]

	tests := []struct {
		name           string
		b              []byte
		ofRun, decided bool
	}{
		{"a run's task", ofRun, true, true},
		{"no origin", plain, false, true},
		{"another origin", other, false, true},
		{"the last origin a run's", lastOfRun, true, true},
		{"the last origin another", lastOther, false, true},
		{"empty", nil, false, true},
		{"origin of the wrong wire type", wrongType, false, false},
		{"cut short", cut, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ofRun, decided := fromRun(tt.b)
			require.Equal(t, tt.decided, decided)
			require.Equal(t, tt.ofRun, ofRun)
			if !decided {
				var ev eventsv1.TaskEvent
				require.Error(t, ev.UnmarshalVT(tt.b), "the full decode refuses it too")
			}
		})
	}
}
