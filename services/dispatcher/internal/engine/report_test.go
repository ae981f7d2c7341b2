package engine_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

func TestReport(t *testing.T) {
	t.Parallel()
	now := at(time.Minute)
	tests := []struct {
		name        string
		maxAttempts int32
		// failFirst fails the first attempt (retry) and claims the second, so
		// the task carries an earlier error.
		failFirst bool
		report    engine.Report
		status    store.Status
		events    []taskevent.Type
		attempt   int32
		err       string
		timedOut  bool
		code      string
		runAt     time.Time // zero: unchanged
		completed time.Time // CompleteBy
		finished  bool
	}{
		{name: "complete", maxAttempts: 3, failFirst: true, report: engine.Report{Kind: engine.Complete, Result: []byte("ok"), Outcome: "sent"},
			status: store.Completed, events: []taskevent.Type{taskevent.Completed}, attempt: 2, finished: true},
		{name: "fail retries after the backoff", maxAttempts: 3, report: engine.Report{Kind: engine.Fail, Error: "boom", Retry: true, TimedOut: true, ErrorCode: "E42"},
			status: store.Queued, events: []taskevent.Type{taskevent.RetryScheduled}, attempt: 1, err: "boom", timedOut: true, code: "E42", runAt: now.Add(10 * time.Second)},
		{name: "fail on the last attempt dead-letters", maxAttempts: 1, report: engine.Report{Kind: engine.Fail, Error: "boom", Retry: true, ErrorCode: "E42"},
			status: store.DeadLettered, events: []taskevent.Type{taskevent.DeadLettered}, attempt: 1, err: "boom", code: "E42", finished: true},
		{name: "non-retryable fails", maxAttempts: 3, report: engine.Report{Kind: engine.Fail, Error: "bad input", Retry: true, NonRetryable: true},
			status: store.Failed, events: []taskevent.Type{taskevent.Failed}, attempt: 1, err: "bad input", finished: true},
		{name: "no retry dead-letters", maxAttempts: 3, report: engine.Report{Kind: engine.Fail, Error: "give up"},
			status: store.DeadLettered, events: []taskevent.Type{taskevent.DeadLettered}, attempt: 1, err: "give up", finished: true},
		{name: "invalid error code is dropped", maxAttempts: 3, report: engine.Report{Kind: engine.Fail, Error: "boom", ErrorCode: "bad code!"},
			status: store.DeadLettered, events: []taskevent.Type{taskevent.DeadLettered}, attempt: 1, err: "boom [dropped", finished: true},
		{name: "nack after its delay, clearing the failure", maxAttempts: 3, failFirst: true, report: engine.Report{Kind: engine.Nack, Delay: 5 * time.Second},
			status: store.Queued, events: []taskevent.Type{taskevent.RetryScheduled}, attempt: 2, err: "nacked", runAt: now.Add(5 * time.Second)},
		{name: "nack delay is capped", maxAttempts: 3, report: engine.Report{Kind: engine.Nack, Error: "later", Delay: 30 * 24 * time.Hour},
			status: store.Queued, events: []taskevent.Type{taskevent.RetryScheduled}, attempt: 1, err: "later", runAt: now.Add(engine.MaxNackDelay)},
		{name: "negative nack delay is now", maxAttempts: 3, report: engine.Report{Kind: engine.Nack, Delay: -time.Second},
			status: store.Queued, events: []taskevent.Type{taskevent.RetryScheduled}, attempt: 1, err: "nacked", runAt: now},
		{name: "nack on the last attempt dead-letters", maxAttempts: 1, report: engine.Report{Kind: engine.Nack},
			status: store.DeadLettered, events: []taskevent.Type{taskevent.DeadLettered}, attempt: 1, err: "nacked", finished: true},
		{name: "abandon takes the attempt back and keeps the error", maxAttempts: 3, failFirst: true, report: engine.Report{Kind: engine.Abandon},
			status: store.Queued, events: []taskevent.Type{taskevent.Abandoned}, attempt: 1, err: "first", timedOut: true, code: "E1", runAt: now},
		{name: "pending waits the default", maxAttempts: 3, report: engine.Report{Kind: engine.Pending},
			status: store.Waiting, events: []taskevent.Type{taskevent.Waiting}, attempt: 1, completed: now.Add(engine.DefaultAsyncTimeout)},
		{name: "pending waits its time", maxAttempts: 3, report: engine.Report{Kind: engine.Pending, Delay: time.Hour},
			status: store.Waiting, events: []taskevent.Type{taskevent.Waiting}, attempt: 1, completed: now.Add(time.Hour)},
		{name: "pending wait is capped", maxAttempts: 3, report: engine.Report{Kind: engine.Pending, Delay: 30 * 24 * time.Hour},
			status: store.Waiting, events: []taskevent.Type{taskevent.Waiting}, attempt: 1, completed: now.Add(engine.MaxAsyncTimeout)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := engine.New(0)
			task := running(t, p, tt.maxAttempts, t0)
			if tt.failFirst {
				ok, _ := p.Report(nil, ns, engine.Report{TaskID: task.ID.String(), Attempt: 1, Kind: engine.Fail, Error: "first", Retry: true, TimedOut: true, ErrorCode: "E1"}, t0)
				require.True(t, ok)
				task = claimOne(t, p, "send", at(20*time.Second))
				require.Equal(t, int32(2), task.Attempt)
			}
			before := get(t, p, task.ID)
			r := tt.report
			r.TaskID, r.Attempt = task.ID.String(), task.Attempt
			r.TraceContext = map[string]string{"traceparent": "00-report"}
			ok, changes := p.Report(nil, ns, r, now)
			require.True(t, ok)
			require.Equal(t, tt.events, types(changes))
			got := get(t, p, task.ID)
			for _, c := range changes {
				require.Equal(t, got, c.Task)
				require.Equal(t, r.TraceContext, c.TraceHeaders)
			}
			require.Equal(t, tt.status, got.Status)
			require.Equal(t, tt.attempt, got.Attempt)
			require.True(t, strings.HasPrefix(got.Error, tt.err), "error %q", got.Error)
			if tt.err == "" {
				require.Empty(t, got.Error)
			}
			require.Equal(t, tt.timedOut, got.TimedOut)
			require.Equal(t, tt.code, got.ErrorCode)
			require.Zero(t, got.LeaseUntil)
			require.Equal(t, now, got.UpdatedAt)
			require.Equal(t, before.WorkerID, got.WorkerID)
			if tt.runAt.IsZero() {
				require.Equal(t, before.RunAt, got.RunAt)
			} else {
				require.Equal(t, tt.runAt, got.RunAt)
			}
			require.Equal(t, tt.completed, got.CompleteBy)
			require.Equal(t, tt.completed, got.Row().CompleteBy)
			require.Equal(t, tt.finished, !got.FinishedAt.IsZero())
			require.Equal(t, tt.finished, got.Final())
			if tt.status == store.Completed {
				require.Equal(t, []byte("ok"), got.Result)
				require.Equal(t, "sent", got.Outcome)
			}
			// The task is claimable again only once it is queued and due.
			ready := 0
			if tt.status == store.Queued && !tt.runAt.After(now) {
				ready = 1
			}
			require.Equal(t, ready, p.Ready(ns, "send", now))
		})
	}
}

func TestReportStaleChangesNothing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// edit turns a good report on the running task into a stale one.
		edit  func(r *engine.Report)
		ns    string
		setup func(t *testing.T, p *engine.Partition, task engine.Task)
	}{
		{name: "wrong attempt", edit: func(r *engine.Report) { r.Attempt = 2 }},
		{name: "wrong namespace", ns: "other"},
		{name: "unknown id", edit: func(r *engine.Report) { r.TaskID = uuid.NewString() }},
		{name: "malformed id", edit: func(r *engine.Report) { r.TaskID = "nope" }},
		{name: "no kind", edit: func(r *engine.Report) { r.Kind = 0 }},
		{name: "already final", setup: func(t *testing.T, p *engine.Partition, task engine.Task) {
			ok, _ := p.Report(nil, ns, engine.Report{TaskID: task.ID.String(), Attempt: 1, Kind: engine.Complete}, t0)
			require.True(t, ok)
		}},
		{name: "waiting", setup: func(t *testing.T, p *engine.Partition, task engine.Task) {
			ok, _ := p.Report(nil, ns, engine.Report{TaskID: task.ID.String(), Attempt: 1, Kind: engine.Pending}, t0)
			require.True(t, ok)
		}},
		{name: "lease expired", setup: func(t *testing.T, p *engine.Partition, task engine.Task) {
			require.NotEmpty(t, p.Tick(task.LeaseUntil))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := engine.New(0)
			task := running(t, p, 3, t0)
			if tt.setup != nil {
				tt.setup(t, p, task)
			}
			before := get(t, p, task.ID)
			for _, kind := range []engine.Kind{engine.Complete, engine.Fail, engine.Nack, engine.Abandon, engine.Pending} {
				r := engine.Report{TaskID: task.ID.String(), Attempt: 1, Kind: kind, Retry: true}
				if tt.edit != nil {
					tt.edit(&r)
				}
				reportNS := ns
				if tt.ns != "" {
					reportNS = tt.ns
				}
				ok, changes := p.Report(nil, reportNS, r, at(time.Minute))
				require.False(t, ok)
				require.Empty(t, changes)
				require.Equal(t, before, get(t, p, task.ID))
			}
		})
	}
}

func TestFinish(t *testing.T) {
	t.Parallel()
	now := at(time.Minute)
	tests := []struct {
		name    string
		pending bool
		final   bool
		token   func(task engine.Task) engine.Token
		ns      string
		finish  engine.Finish
		status  store.Status
		event   taskevent.Type
		errKind fault.Kind
	}{
		{name: "complete a waiting task", pending: true, finish: engine.Finish{Result: []byte("r"), Outcome: "done"},
			status: store.Completed, event: taskevent.Completed},
		{name: "fail a waiting task", pending: true, finish: engine.Finish{Failed: true, Error: "rejected", ErrorCode: "E9"},
			status: store.Failed, event: taskevent.Failed},
		{name: "complete a running task", finish: engine.Finish{Result: []byte("r")}, status: store.Completed, event: taskevent.Completed},
		{name: "wrong secret", pending: true, errKind: fault.NotFound, token: func(task engine.Task) engine.Token {
			return engine.Token{ID: task.ID, Attempt: task.Attempt, Secret: make([]byte, 16)}
		}},
		{name: "wrong attempt", pending: true, errKind: fault.NotFound, token: func(task engine.Task) engine.Token {
			return engine.Token{ID: task.ID, Attempt: task.Attempt + 1, Secret: task.CompletionSecret}
		}},
		{name: "unknown task", pending: true, errKind: fault.NotFound, token: func(task engine.Task) engine.Token {
			return engine.Token{ID: uuid.New(), Attempt: task.Attempt, Secret: task.CompletionSecret}
		}},
		{name: "wrong namespace", pending: true, ns: "other", errKind: fault.NotFound},
		{name: "already final", pending: true, final: true, errKind: fault.Precondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := engine.New(0)
			task := running(t, p, 3, t0)
			if tt.pending {
				ok, _ := p.Report(nil, ns, engine.Report{TaskID: task.ID.String(), Attempt: 1, Kind: engine.Pending}, t0)
				require.True(t, ok)
			}
			if tt.final {
				_, _, err := p.Finish(ns, engine.Token{ID: task.ID, Attempt: 1, Secret: task.CompletionSecret}, engine.Finish{}, t0)
				require.NoError(t, err)
			}
			tok := engine.Token{ID: task.ID, Attempt: task.Attempt, Secret: task.CompletionSecret}
			if tt.token != nil {
				tok = tt.token(task)
			}
			finishNS := ns
			if tt.ns != "" {
				finishNS = tt.ns
			}
			before := get(t, p, task.ID)
			got, changes, err := p.Finish(finishNS, tok, tt.finish, now)
			if tt.errKind != 0 {
				kind, _, ok := fault.KindOf(err)
				require.True(t, ok, "%v", err)
				require.Equal(t, tt.errKind, kind)
				require.Empty(t, changes)
				require.Equal(t, before, get(t, p, task.ID))
				return
			}
			require.NoError(t, err)
			require.Equal(t, []taskevent.Type{tt.event}, types(changes))
			require.Equal(t, got, changes[0].Task)
			require.Equal(t, got, get(t, p, task.ID))
			require.Equal(t, tt.status, got.Status)
			require.Equal(t, now, got.FinishedAt)
			require.Zero(t, got.CompleteBy)
			require.Zero(t, got.LeaseUntil)
			require.False(t, got.TimedOut)
			if tt.finish.Failed {
				require.Nil(t, got.Result)
				require.Equal(t, tt.finish.Error, got.Error)
				require.Equal(t, tt.finish.ErrorCode, got.ErrorCode)
			} else {
				require.Equal(t, tt.finish.Result, got.Result)
				require.Equal(t, tt.finish.Outcome, got.Outcome)
			}
			// The handler's answer, coming after, matches nothing.
			ok, _ := p.Report(nil, ns, engine.Report{TaskID: task.ID.String(), Attempt: 1, Kind: engine.Complete}, now)
			require.False(t, ok)
		})
	}
}

func TestToken(t *testing.T) {
	t.Parallel()
	tok := engine.Token{ID: uuid.New(), Attempt: 7, Secret: []byte("0123456789abcdef")}
	s := tok.String()
	require.True(t, strings.HasPrefix(s, "flo1."))
	got, err := engine.ParseToken(s)
	require.NoError(t, err)
	require.Equal(t, tok, got)
	require.Empty(t, engine.Token{ID: tok.ID, Attempt: 1, Secret: []byte("short")}.String())
	for _, bad := range []string{"", "flo1.", "flo2." + s[5:], s[:len(s)-2], "flo1.!!!"} {
		_, err := engine.ParseToken(bad)
		kind, _, ok := fault.KindOf(err)
		require.True(t, ok, bad)
		require.Equal(t, fault.Invalid, kind)
	}
}
