package service_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

const (
	evWaiting = eventsv1.TaskEventType_TASK_EVENT_TYPE_WAITING
	stWaiting = flov1.TaskStatus_TASK_STATUS_WAITING
)

func pending(a *flov1.TaskAssignment, timeout time.Duration) *dispatcherv1.Report {
	return &dispatcherv1.Report{TaskId: a.GetTaskId(), Attempt: a.GetAttempt(),
		Kind: &dispatcherv1.Report_Pending{Pending: &flov1.Pending{TimeoutMs: timeout.Milliseconds()}}}
}

// TestAsyncCompletion covers tasks whose handler answers that the result comes
// later: completion and failure by token, double completion, bad tokens and
// the async deadline.
func TestAsyncCompletion(t *testing.T) {
	e := startEnv(t)
	t.Run("complete", func(t *testing.T) { t.Parallel(); testAsyncComplete(t, e) })
	t.Run("fail", func(t *testing.T) { t.Parallel(); testAsyncFail(t, e) })
	t.Run("bad tokens", func(t *testing.T) { t.Parallel(); testAsyncBadTokens(t, e) })
	t.Run("deadline", func(t *testing.T) { t.Parallel(); testAsyncDeadline(t, e) })
	t.Run("before pending", func(t *testing.T) { t.Parallel(); testAsyncBeforePending(t, e) })
}

// waitFor claims a task and reports it pending.
func (e *env) waitFor(t *testing.T, ns, action string, timeout time.Duration) (string, *flov1.TaskAssignment) {
	t.Helper()
	e.register(t, ns, action, &flov1.RegisterActionRequest{MaxAttempts: 3})
	id := e.invoke(t, ns, action, `{"order":7}`)
	a := e.claimOne(t, ns, action, 0)
	require.True(t, strings.HasPrefix(a.GetCompletionToken(), "flo1."), a.GetCompletionToken())
	require.NotContains(t, a.GetCompletionToken(), id)
	require.Empty(t, e.report(t, ns, pending(a, timeout)))
	return id, a
}

func testAsyncComplete(t *testing.T, e *env) {
	ns := e.namespace(t)
	id, a := e.waitFor(t, ns, "charge", 0)
	task := e.task(t, ns, id)
	require.Equal(t, stWaiting, task.GetStatus())
	require.Equal(t, int32(1), task.GetAttempt())
	// The default deadline is a day away.
	require.WithinDuration(t, time.Now().Add(24*time.Hour), task.GetCompleteBy().AsTime(), time.Minute)
	// The worker's slot is free: a late result from it changes nothing.
	require.Equal(t, []string{id}, e.report(t, ns, completed(a, `"late"`, "")))

	done, err := e.client.CompleteTask(t.Context(), &flov1.CompleteTaskRequest{
		Namespace: ns, Token: a.GetCompletionToken(), Result: []byte(`{"paid":true}`), Outcome: "paid"})
	require.NoError(t, err)
	require.Equal(t, stCompleted, done.GetStatus())
	require.JSONEq(t, `{"paid":true}`, string(done.GetResult()))
	require.Equal(t, "paid", done.GetOutcome())
	require.Nil(t, done.GetCompleteBy())
	evs := e.events.waitEvents(t, id, evCreated, evStarted, evWaiting, evCompleted)
	require.Equal(t, stWaiting, evs[2].GetStatus())
	require.Equal(t, "paid", evs[3].GetOutcome())

	// Exactly once: a second completion or failure is refused.
	_, err = e.client.CompleteTask(t.Context(), &flov1.CompleteTaskRequest{Namespace: ns, Token: a.GetCompletionToken(), Result: []byte(`1`)})
	requireCode(t, codes.FailedPrecondition, err, "is completed, not waiting")
	_, err = e.client.FailTask(t.Context(), &flov1.FailTaskRequest{Namespace: ns, Token: a.GetCompletionToken(), Error: "late"})
	requireCode(t, codes.FailedPrecondition, err, "not waiting")
	require.JSONEq(t, `{"paid":true}`, string(e.task(t, ns, id).GetResult()))
}

func testAsyncFail(t *testing.T, e *env) {
	ns := e.namespace(t)
	id, a := e.waitFor(t, ns, "ship", time.Hour)
	require.WithinDuration(t, time.Now().Add(time.Hour), e.task(t, ns, id).GetCompleteBy().AsTime(), time.Minute)

	task, err := e.client.FailTask(t.Context(), &flov1.FailTaskRequest{
		Namespace: ns, Token: a.GetCompletionToken(), Error: "carrier refused", ErrorCode: "carrier_refused"})
	require.NoError(t, err)
	// Final, though attempts remain.
	require.Equal(t, stFailed, task.GetStatus())
	require.Equal(t, int32(1), task.GetAttempt())
	require.Equal(t, "carrier refused", task.GetError())
	require.Equal(t, "carrier_refused", task.GetErrorCode())
	require.False(t, task.GetTimedOut())
	evs := e.events.waitEvents(t, id, evCreated, evStarted, evWaiting, evFailed)
	require.Equal(t, "carrier_refused", evs[3].GetErrorCode())
	require.True(t, evs[3].GetNonRetryable())

	_, err = e.client.FailTask(t.Context(), &flov1.FailTaskRequest{Namespace: ns, Token: a.GetCompletionToken(), Error: "again"})
	requireCode(t, codes.FailedPrecondition, err, "is failed, not waiting")
}

func testAsyncBadTokens(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "hook", nil)
	id := e.invoke(t, ns, "hook", `{}`)
	a := e.claimOne(t, ns, "hook", 0)
	tok := a.GetCompletionToken()

	require.Empty(t, e.report(t, ns, pending(a, 0)))

	var err error
	for _, bad := range []string{"", "nope", id, "flo1." + strings.Repeat("A", 10)} {
		_, err = e.client.CompleteTask(t.Context(), &flov1.CompleteTaskRequest{Namespace: ns, Token: bad})
		requireCode(t, codes.InvalidArgument, err, "not a completion token")
	}
	// A well-formed token with another secret says no more than an unknown task.
	forged := tok[:len(tok)-4] + flip(tok[len(tok)-4:])
	_, err = e.client.CompleteTask(t.Context(), &flov1.CompleteTaskRequest{Namespace: ns, Token: forged})
	requireCode(t, codes.NotFound, err, "waits for this token")
	// Another namespace's caller cannot use it.
	other := e.namespace(t)
	_, err = e.client.CompleteTask(t.Context(), &flov1.CompleteTaskRequest{Namespace: other, Token: tok})
	requireCode(t, codes.NotFound, err, "waits for this token")
	require.Equal(t, stWaiting, e.task(t, ns, id).GetStatus())
}

// flip changes every character of a base64url tail.
func flip(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
	}
	return string(b)
}

func testAsyncDeadline(t *testing.T, e *env) {
	ns := e.namespace(t)
	id, a := e.waitFor(t, ns, "webhook", 50*time.Millisecond)
	task := e.waitStatus(t, ns, id, stFailed)
	require.True(t, task.GetTimedOut(), "no result by the deadline is a timeout")
	require.Equal(t, "no result by the async deadline", task.GetError())
	require.Equal(t, int32(1), task.GetAttempt(), "no further attempt")
	evs := e.events.waitEvents(t, id, evCreated, evStarted, evWaiting, evFailed)
	require.True(t, evs[3].GetTimedOut())

	_, err := e.client.CompleteTask(t.Context(), &flov1.CompleteTaskRequest{Namespace: ns, Token: a.GetCompletionToken()})
	requireCode(t, codes.FailedPrecondition, err, "async deadline passed")
}

// testAsyncBeforePending: a webhook may beat the handler's pending answer; the
// token finishes the running attempt and the late answer is refused.
func testAsyncBeforePending(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "quick", nil)
	id := e.invoke(t, ns, "quick", `{}`)
	a := e.claimOne(t, ns, "quick", 0)
	done, err := e.client.CompleteTask(t.Context(), &flov1.CompleteTaskRequest{Namespace: ns, Token: a.GetCompletionToken(), Result: []byte(`"early"`)})
	require.NoError(t, err)
	require.Equal(t, stCompleted, done.GetStatus())
	require.Equal(t, []string{id}, e.report(t, ns, pending(a, 0)))
	e.events.waitEvents(t, id, evCreated, evStarted, evCompleted)
	require.Equal(t, stCompleted, e.task(t, ns, id).GetStatus())
}
