package report

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	running := func(attempt, maxAttempts int32) store.RunningTask {
		return store.RunningTask{ID: id, Attempt: attempt, MaxAttempts: maxAttempts,
			Backoff: backoff.Policy{Kind: backoff.Linear, Initial: time.Second, Max: time.Minute}}
	}
	tests := []struct {
		name   string
		report Report
		task   store.RunningTask
		want   plan
	}{
		{
			name:   "retryable failure with attempts left waits the backoff",
			report: Report{Kind: Fail, Error: "boom", Retry: true},
			task:   running(2, 3),
			want:   plan{store.Disposition{ID: id, Status: store.Queued, Delay: 2 * time.Second, Error: "boom"}, []taskevent.Type{taskevent.RetryScheduled}},
		},
		{
			name:   "retryable failure of the last attempt dead-letters",
			report: Report{Kind: Fail, Error: "boom", Retry: true},
			task:   running(3, 3),
			want:   plan{store.Disposition{ID: id, Status: store.DeadLettered, Error: "boom"}, []taskevent.Type{taskevent.DeadLettered}},
		},
		{
			name:   "retry=false dead-letters at once",
			report: Report{Kind: Fail, Error: "stop"},
			task:   running(1, 3),
			want:   plan{store.Disposition{ID: id, Status: store.DeadLettered, Error: "stop"}, []taskevent.Type{taskevent.DeadLettered}},
		},
		{
			name:   "non-retryable fails without dead-lettering, even with retry set",
			report: Report{Kind: Fail, Error: "bad input", Retry: true, NonRetryable: true},
			task:   running(1, 3),
			want:   plan{store.Disposition{ID: id, Status: store.Failed, Error: "bad input"}, []taskevent.Type{taskevent.Failed}},
		},
		{
			name:   "a timed-out non-retryable failure records the timeout on the failed task",
			report: Report{Kind: Fail, Error: "context deadline exceeded", NonRetryable: true, TimedOut: true},
			task:   running(1, 3),
			want:   plan{store.Disposition{ID: id, Status: store.Failed, Error: "context deadline exceeded", TimedOut: true}, []taskevent.Type{taskevent.Failed}},
		},
		{
			name:   "a timed-out retryable failure with attempts left is retried and records the timeout",
			report: Report{Kind: Fail, Error: "slow", Retry: true, TimedOut: true},
			task:   running(1, 2),
			want:   plan{store.Disposition{ID: id, Status: store.Queued, Delay: time.Second, Error: "slow", TimedOut: true}, []taskevent.Type{taskevent.RetryScheduled}},
		},
		{
			name:   "a timed-out retryable failure of the last attempt dead-letters it as timed out",
			report: Report{Kind: Fail, Error: "slow", Retry: true, TimedOut: true},
			task:   running(2, 2),
			want:   plan{store.Disposition{ID: id, Status: store.DeadLettered, Error: "slow", TimedOut: true}, []taskevent.Type{taskevent.DeadLettered}},
		},
		{
			name:   "a coded failure with attempts left is retried and records its code",
			report: Report{Kind: Fail, Error: "declined", Retry: true, ErrorCode: "card_declined"},
			task:   running(1, 2),
			want:   plan{store.Disposition{ID: id, Status: store.Queued, Delay: time.Second, Error: "declined", ErrorCode: "card_declined"}, []taskevent.Type{taskevent.RetryScheduled}},
		},
		{
			name:   "a coded non-retryable failure records its code on the failed task",
			report: Report{Kind: Fail, Error: "declined", NonRetryable: true, ErrorCode: "card_declined"},
			task:   running(1, 3),
			want:   plan{store.Disposition{ID: id, Status: store.Failed, Error: "declined", ErrorCode: "card_declined"}, []taskevent.Type{taskevent.Failed}},
		},
		{
			name:   "nack waits its own delay",
			report: Report{Kind: Nack, Error: "busy", Delay: 5 * time.Second},
			task:   running(1, 3),
			want:   plan{store.Disposition{ID: id, Status: store.Queued, Delay: 5 * time.Second, Error: "busy"}, []taskevent.Type{taskevent.RetryScheduled}},
		},
		{
			name:   "nack without reason or delay",
			report: Report{Kind: Nack, Delay: -time.Second},
			task:   running(1, 3),
			want:   plan{store.Disposition{ID: id, Status: store.Queued, Error: "nacked"}, []taskevent.Type{taskevent.RetryScheduled}},
		},
		{
			name:   "nack of the last attempt dead-letters",
			report: Report{Kind: Nack, Error: "busy", Delay: time.Second},
			task:   running(3, 3),
			want:   plan{store.Disposition{ID: id, Status: store.DeadLettered, Error: "busy"}, []taskevent.Type{taskevent.DeadLettered}},
		},
		{
			name:   "abandon requeues at once without counting and keeps the error",
			report: Report{Kind: Abandon},
			task:   running(3, 3),
			want:   plan{store.Disposition{ID: id, Status: store.Queued, Uncount: true, KeepError: true}, []taskevent.Type{taskevent.Abandoned}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, decide(tt.report, tt.task))
		})
	}
}
