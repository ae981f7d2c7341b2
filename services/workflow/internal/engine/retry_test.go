package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// retryFlow runs one action with the given retry block.
func retryFlow(retry string) string {
	return fmt.Sprintf(`
kind: Workflow
name: flaky
version: "1"
start:
  run: "@actions/flaky-service"
  retry:
%s
  transitions:
    success: flo.Completed
    failure: flo.Failed
`, retry)
}

func TestRetryBackoffStrategies(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		name  string
		retry string
		draw  float64
		want  []time.Duration
	}{
		{
			name:  "constant",
			retry: "    max_attempts: 6\n    backoff: constant\n    initial_delay_ms: 1000",
			want:  []time.Duration{1000 * ms, 1000 * ms, 1000 * ms, 1000 * ms, 1000 * ms},
		},
		{
			name:  "linear capped by max_delay_ms",
			retry: "    max_attempts: 6\n    backoff: linear\n    initial_delay_ms: 1000\n    max_delay_ms: 3500",
			want:  []time.Duration{1000 * ms, 2000 * ms, 3000 * ms, 3500 * ms, 3500 * ms},
		},
		{
			name:  "exponential capped by max_delay_ms",
			retry: "    max_attempts: 6\n    backoff: exponential\n    initial_delay_ms: 1000\n    max_delay_ms: 8000",
			want:  []time.Duration{1000 * ms, 2000 * ms, 4000 * ms, 8000 * ms, 8000 * ms},
		},
		{
			name:  "exponential with multiplier 3",
			retry: "    max_attempts: 4\n    backoff: exponential\n    initial_delay_ms: 100\n    multiplier: 3",
			want:  []time.Duration{100 * ms, 300 * ms, 900 * ms},
		},
		{
			name:  "exponential_jitter adds up to 25%",
			retry: "    max_attempts: 6\n    backoff: exponential_jitter\n    initial_delay_ms: 1000\n    max_delay_ms: 8000",
			draw:  0.5, // half of the 25%: 12.5% extra
			want:  []time.Duration{1125 * ms, 2250 * ms, 4500 * ms, 8000 * ms, 8000 * ms},
		},
		{
			name:  "exponential_jitter with another draw",
			retry: "    max_attempts: 3\n    backoff: exponential_jitter\n    initial_delay_ms: 1000",
			draw:  0.75,
			want:  []time.Duration{1187500 * time.Microsecond, 2375 * ms},
		},
		{
			name:  "zero delay re-invokes at once",
			retry: "    max_attempts: 3\n    backoff: constant\n    initial_delay_ms: 0",
			want:  []time.Duration{0, 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, retryFlow(tt.retry), `{}`)
			s.rand = func() float64 { return tt.draw }
			s.start()
			var got []time.Duration
			for range tt.want {
				eff := s.fail("boom")
				if len(eff.Invokes) == 1 {
					// No delay: the next attempt is invoked in the same advance.
					require.Empty(t, eff.Timers)
					require.Equal(t, WaitTask, s.run.Wait)
					got = append(got, 0)
					continue
				}
				d := s.timerIn()
				got = append(got, d)
				s.now = s.now.Add(d)
				s.fire()
			}
			require.Equal(t, tt.want, got)
			eff := s.fail("boom")
			require.True(t, eff.Ended, "attempts are used up")
			require.Equal(t, "flo.Failed", s.run.Terminal)
			require.Equal(t, len(tt.want)+1, s.run.Outputs[StartStep].Attempts)
		})
	}
}

func TestRetryWithinStopsRetries(t *testing.T) {
	t.Parallel()
	s := newSim(t, retryFlow("    max_attempts: 10\n    backoff: exponential\n    initial_delay_ms: 1000\n    within_ms: 2500"), `{}`)
	s.start()
	s.now = s.now.Add(100 * time.Millisecond)
	s.fail("boom") // elapsed 0.1 s + 1 s delay fits in 2.5 s
	require.Equal(t, time.Second, s.timerIn())
	s.fire()
	eff := s.fail("boom") // elapsed 1.1 s + 2 s delay would start after 2.5 s
	require.True(t, eff.Ended)
	require.Equal(t, StatusFailed, s.run.Status)
	require.Equal(t, 2, s.run.Outputs[StartStep].Attempts)
	require.Equal(t, 1, countType(s.history, "step_retry"))
}

func TestRetryOnlyForFailures(t *testing.T) {
	t.Parallel()
	src := `
kind: Workflow
name: outcomes
version: "1"
start:
  run: "@actions/a"
  retry:
    max_attempts: 3
    backoff: constant
    initial_delay_ms: 10
  transitions:
    success: flo.Completed
    failure: flo.Failed
    execution_failure: Broken
    target_not_found: Missing
    declined: Declined
terminals:
  Broken: {status: failed}
  Missing: {status: failed}
  Declined: {status: completed}
`
	tests := []struct {
		name         string
		ev           TaskEnded
		wantRetry    bool
		wantTerminal string
	}{
		{name: "failure retries", ev: TaskEnded{Outcome: "failure"}, wantRetry: true},
		{name: "NonRetryable takes the failure transition at once", ev: TaskEnded{Outcome: "failure", NonRetryable: true, Error: "bad card"}, wantTerminal: "flo.Failed"},
		{name: "a named outcome does not retry", ev: TaskEnded{Outcome: "declined"}, wantTerminal: "Declined"},
		{name: "target_not_found does not retry", ev: TaskEnded{Outcome: "target_not_found"}, wantTerminal: "Missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, src, `{}`)
			s.start()
			ev := tt.ev
			ev.Token = s.run.Token
			eff := s.do(ev)
			if tt.wantRetry {
				require.Equal(t, WaitRetry, s.run.Wait)
				require.Equal(t, 2, s.run.Attempt)
				require.Equal(t, "step_retry", eff.History[len(eff.History)-1].Type)
				return
			}
			require.True(t, eff.Ended)
			require.Equal(t, tt.wantTerminal, s.run.Terminal)
			require.Zero(t, countType(s.history, "step_retry"))
			require.Equal(t, ev.Error, s.run.Outputs[StartStep].Error)
		})
	}
}

func TestRetriesResetWhenTheStepMovesOn(t *testing.T) {
	t.Parallel()
	src := `
kind: Workflow
name: reset
version: "1"
start:
  run: "@actions/a"
  retry: {max_attempts: 2, backoff: constant, initial_delay_ms: 10}
  transitions:
    success: again
    failure: flo.Failed
steps:
  again:
    run: "@actions/b"
    retry: {max_attempts: 2, backoff: constant, initial_delay_ms: 10}
    transitions:
      success: flo.Completed
      failure: flo.Failed
      retry_from_start: _start
`
	s := newSim(t, src, `{}`)
	s.start()
	s.fail("once")
	s.fire()
	require.Equal(t, 2, s.run.Attempt)
	s.end("success", `{}`)
	require.Equal(t, "again", s.run.Step)
	require.Equal(t, 1, s.run.Attempt)
	require.Equal(t, 0, s.run.Polls)
	require.Equal(t, s.now, s.run.VisitStarted)
	s.fail("once")
	s.fire()
	require.Equal(t, 2, s.run.Attempt, "the new step has its own retries")
	// Back to the start step: its retries are fresh, and its task ids new.
	s.end("retry_from_start", `{}`)
	require.Equal(t, StartStep, s.run.Step)
	require.Equal(t, 1, s.run.Attempt)
	eff := s.fail("again")
	require.Equal(t, WaitRetry, s.run.Wait, "the revisited step may retry again")
	require.Equal(t, "step_retry", eff.History[len(eff.History)-1].Type)
	ids := map[string]bool{}
	for _, in := range s.invokes {
		require.False(t, ids[in.TaskID], "task id reused on a revisit")
		ids[in.TaskID] = true
	}
}

func countType(hs []HistoryEvent, typ string) int {
	n := 0
	for _, h := range hs {
		if h.Type == typ {
			n++
		}
	}
	return n
}

// A task that ran out of time ends its step with the timeout outcome: the
// timeout transition when the step has one, the failure transition when not,
// and retried like a failure while the step's retry policy allows.
func TestTaskTimeoutOutcome(t *testing.T) {
	t.Parallel()
	flow := func(transitions string) string {
		return `
kind: Workflow
name: slow
version: "1"
start:
  run: "@actions/slow"
  retry: {max_attempts: 2, backoff: constant, initial_delay_ms: 10}
  transitions:
` + transitions + `
terminals:
  TooSlow: {status: failed}
`
	}
	withTimeout := flow("    success: flo.Completed\n    failure: flo.Failed\n    timeout: TooSlow")
	tests := []struct {
		name         string
		src          string
		ev           TaskEnded
		wantTerminal string
		wantOutcome  string
	}{
		{name: "timeout transition", src: withTimeout, ev: TaskEnded{Outcome: "failure", TimedOut: true, NonRetryable: true, Error: "context deadline exceeded"},
			wantTerminal: "TooSlow", wantOutcome: "timeout"},
		{name: "no timeout transition fails", src: flow("    success: flo.Completed\n    failure: flo.Failed"), ev: TaskEnded{Outcome: "failure", TimedOut: true, NonRetryable: true},
			wantTerminal: "flo.Failed", wantOutcome: "timeout"},
		{name: "an ordinary failure still fails", src: withTimeout, ev: TaskEnded{Outcome: "failure", NonRetryable: true},
			wantTerminal: "flo.Failed", wantOutcome: "failure"},
		{name: "a named outcome is not a timeout", src: flow("    success: flo.Completed\n    declined: flo.Failed\n    timeout: TooSlow"), ev: TaskEnded{Outcome: "declined", TimedOut: true},
			wantTerminal: "flo.Failed", wantOutcome: "declined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSim(t, tt.src, `{}`)
			s.start()
			ev := tt.ev
			ev.Token = s.run.Token
			eff := s.do(ev)
			require.True(t, eff.Ended)
			require.Equal(t, tt.wantTerminal, s.run.Terminal)
			require.Equal(t, tt.wantOutcome, s.run.Outputs[StartStep].Outcome)
		})
	}

	t.Run("retried while attempts are left", func(t *testing.T) {
		t.Parallel()
		s := newSim(t, withTimeout, `{}`)
		s.start()
		s.do(TaskEnded{Token: s.run.Token, Outcome: "failure", TimedOut: true, Error: "lease expired"})
		require.Equal(t, WaitRetry, s.run.Wait)
		s.fire()
		eff := s.do(TaskEnded{Token: s.run.Token, Outcome: "failure", TimedOut: true, Error: "lease expired"})
		require.True(t, eff.Ended)
		require.Equal(t, "TooSlow", s.run.Terminal)
		require.Equal(t, 2, s.run.Outputs[StartStep].Attempts)
	})
}

// A failed task's error code is recorded with its step and named in the
// step's error, its history and the run's error.
func TestTaskErrorCode(t *testing.T) {
	t.Parallel()
	s := newSim(t, `
kind: Workflow
name: pay
version: "1"
start:
  run: "@actions/charge"
  retry: {max_attempts: 2, backoff: constant, initial_delay_ms: 10}
  transitions:
    success: flo.Completed
`, `{}`)
	s.start()
	s.do(TaskEnded{Token: s.run.Token, Outcome: "failure", Error: "busy", ErrorCode: "rate_limited"})
	require.Equal(t, WaitRetry, s.run.Wait)
	s.fire()
	eff := s.do(TaskEnded{Token: s.run.Token, Outcome: "failure", Error: "card declined", NonRetryable: true, ErrorCode: "card_declined"})
	require.True(t, eff.Ended)
	res := s.run.Outputs[StartStep]
	require.Equal(t, "card_declined", res.ErrorCode)
	require.Equal(t, "card declined (error code card_declined)", res.Error)
	require.Contains(t, s.run.Error, "card declined (error code card_declined)")
	var details []string
	for _, h := range s.history {
		details = append(details, h.Type+" "+h.Detail)
	}
	require.Contains(t, details, HistoryActionCompleted+" failure: busy (error code rate_limited)")
	require.Contains(t, details, HistoryStepCompleted+" failure: card declined (error code card_declined)")
}
