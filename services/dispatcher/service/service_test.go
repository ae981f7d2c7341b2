package service_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

const (
	evCreated   = eventsv1.TaskEventType_TASK_EVENT_TYPE_CREATED
	evStarted   = eventsv1.TaskEventType_TASK_EVENT_TYPE_STARTED
	evCompleted = eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED
	evFailed    = eventsv1.TaskEventType_TASK_EVENT_TYPE_FAILED
	evRetry     = eventsv1.TaskEventType_TASK_EVENT_TYPE_RETRY_SCHEDULED
	evDead      = eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED
	evRequeued  = eventsv1.TaskEventType_TASK_EVENT_TYPE_REQUEUED
	evAbandoned = eventsv1.TaskEventType_TASK_EVENT_TYPE_ABANDONED
	evExpired   = eventsv1.TaskEventType_TASK_EVENT_TYPE_LEASE_EXPIRED
	evRejected  = eventsv1.TaskEventType_TASK_EVENT_TYPE_REJECTED

	stQueued    = flov1.TaskStatus_TASK_STATUS_QUEUED
	stRunning   = flov1.TaskStatus_TASK_STATUS_RUNNING
	stCompleted = flov1.TaskStatus_TASK_STATUS_COMPLETED
	stFailed    = flov1.TaskStatus_TASK_STATUS_FAILED
	stDead      = flov1.TaskStatus_TASK_STATUS_DEAD_LETTERED
)

// TestDispatcher runs the behaviour tests against one dispatcher; each
// subtest owns a namespace, so they run in parallel.
func TestDispatcher(t *testing.T) {
	e := startEnv(t)
	t.Run("errors", func(t *testing.T) { t.Parallel(); testErrors(t, e) })
	t.Run("actions", func(t *testing.T) { t.Parallel(); testActions(t, e) })
	t.Run("commands", func(t *testing.T) { t.Parallel(); testCommands(t, e) })
	t.Run("idempotent insert", func(t *testing.T) { t.Parallel(); testIdempotentInsert(t, e) })
	t.Run("completed", func(t *testing.T) { t.Parallel(); testCompleted(t, e) })
	t.Run("retry then dead letter", func(t *testing.T) { t.Parallel(); testRetryThenDeadLetter(t, e) })
	t.Run("non retryable", func(t *testing.T) { t.Parallel(); testNonRetryable(t, e) })
	t.Run("retry false", func(t *testing.T) { t.Parallel(); testRetryFalse(t, e) })
	t.Run("nack", func(t *testing.T) { t.Parallel(); testNack(t, e) })
	t.Run("error code", func(t *testing.T) { t.Parallel(); testErrorCode(t, e) })
	t.Run("abandon", func(t *testing.T) { t.Parallel(); testAbandon(t, e) })
	t.Run("lease expiry", func(t *testing.T) { t.Parallel(); testLeaseExpiry(t, e) })
	t.Run("touch", func(t *testing.T) { t.Parallel(); testTouch(t, e) })
	t.Run("requeue", func(t *testing.T) { t.Parallel(); testRequeue(t, e) })
	t.Run("claim waits for work", func(t *testing.T) { t.Parallel(); testClaimWaits(t, e) })
	t.Run("end claim", func(t *testing.T) { t.Parallel(); testEndClaim(t, e) })
	t.Run("claim spreads tasks over its slots", func(t *testing.T) { t.Parallel(); testClaimSlots(t, e) })
	t.Run("priority and delay", func(t *testing.T) { t.Parallel(); testPriorityAndDelay(t, e) })
	t.Run("priority across partitions", func(t *testing.T) { t.Parallel(); testPriorityAcrossPartitions(t, e) })
	t.Run("disabled action", func(t *testing.T) { t.Parallel(); testDisabled(t, e) })
	t.Run("http", func(t *testing.T) { t.Parallel(); testHTTP(t, e) })
	t.Run("origin", func(t *testing.T) { t.Parallel(); testOrigin(t, e) })
	t.Run("huge error", func(t *testing.T) { t.Parallel(); testHugeError(t, e) })
}

// testOrigin: a task invoked with an origin carries it in every event, its
// completion carries the result, and invoking an unknown or disabled action
// answers with a REJECTED event instead of a task.
func testOrigin(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "step", &flov1.RegisterActionRequest{MaxAttempts: 1})
	e.register(t, ns, "off", nil)
	_, err := e.client.SetActionEnabled(t.Context(), &dispatcherv1.SetActionEnabledRequest{Namespace: ns, Name: "off", Enabled: false})
	require.NoError(t, err)

	const origin = "workflow:run-1/charge/1"
	withOrigin := &eventsv1.InvokeTask{Namespace: ns, Action: "step", Payload: []byte(`{}`), Origin: origin}
	plain := &eventsv1.InvokeTask{Namespace: ns, Action: "step", Payload: []byte(`{}`)}
	missing := &eventsv1.InvokeTask{Namespace: ns, Action: "missing", Origin: origin}
	disabled := &eventsv1.InvokeTask{Namespace: ns, Action: "off", Origin: origin}
	plainDisabled := &eventsv1.InvokeTask{Namespace: ns, Action: "off"}
	e.produce(t, "", nil, withOrigin, plain, missing, disabled, plainDisabled)

	rej := e.events.waitEvents(t, missing.GetTaskId(), evRejected)[0]
	require.Equal(t, "target_not_found", rej.GetOutcome())
	require.Equal(t, origin, rej.GetOrigin())
	require.Contains(t, rej.GetError(), `action "missing" does not exist`)
	rej = e.events.waitEvents(t, disabled.GetTaskId(), evRejected)[0]
	require.Equal(t, "target_disabled", rej.GetOutcome())
	_, err = e.client.GetTask(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: disabled.GetTaskId()})
	requireCode(t, codes.NotFound, err, "not found")
	// Without an origin a disabled action's task is queued as before: the
	// gateway refuses those invocations itself.
	require.Equal(t, stQueued, e.waitTask(t, ns, plainDisabled.GetTaskId()).GetStatus())

	e.waitTask(t, ns, withOrigin.GetTaskId())
	e.waitTask(t, ns, plain.GetTaskId())
	for range 2 {
		a := e.claimOne(t, ns, "step", time.Minute)
		e.report(t, ns, completed(a, `{"ok":true}`, "approved"))
	}
	evs := e.events.waitEvents(t, withOrigin.GetTaskId(), evCreated, evStarted, evCompleted)
	for _, ev := range evs {
		require.Equal(t, origin, ev.GetOrigin())
	}
	require.JSONEq(t, `{"ok":true}`, string(evs[2].GetResult()))
	require.Equal(t, "approved", evs[2].GetOutcome())
	evs = e.events.waitEvents(t, plain.GetTaskId(), evCreated, evStarted, evCompleted)
	require.Empty(t, evs[2].GetResult(), "results stay off the log for tasks without an origin")

	e.register(t, ns, "step", &flov1.RegisterActionRequest{MaxAttempts: 5})
	failing := &eventsv1.InvokeTask{Namespace: ns, Action: "step", Payload: []byte(`{}`), Origin: origin, MaxAttempts: 1}
	e.produce(t, "", nil, failing)
	e.waitTask(t, ns, failing.GetTaskId())
	a := e.claimOne(t, ns, "step", time.Minute)
	e.report(t, ns, failed(a, "card declined", false, true))
	evs = e.events.waitEvents(t, failing.GetTaskId(), evCreated, evStarted, evFailed)
	require.True(t, evs[2].GetNonRetryable())

	// One attempt asked for: a retryable failure dead-letters at once
	// instead of following the action's five attempts.
	once := &eventsv1.InvokeTask{Namespace: ns, Action: "step", Payload: []byte(`{}`), Origin: origin, MaxAttempts: 1}
	e.produce(t, "", nil, once)
	require.Equal(t, int32(1), e.waitTask(t, ns, once.GetTaskId()).GetMaxAttempts())
	a = e.claimOne(t, ns, "step", time.Minute)
	e.report(t, ns, failed(a, "flaky", true, false))
	e.events.waitEvents(t, once.GetTaskId(), evCreated, evStarted, evDead)
}

func requireCode(t *testing.T, want codes.Code, err error, msgContains string) {
	t.Helper()
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status: %v", err)
	require.Equal(t, want, st.Code(), st.Message())
	require.Contains(t, st.Message(), msgContains)
}

func testErrors(t *testing.T, e *env) {
	ctx := t.Context()
	ns := e.namespace(t)
	e.register(t, ns, "known", nil)

	_, err := e.client.GetAction(ctx, &flov1.GetActionRequest{Namespace: "nope", Name: "known"})
	requireCode(t, codes.NotFound, err, "namespace nope not found")
	_, err = e.client.RegisterAction(ctx, &flov1.RegisterActionRequest{Namespace: "nope", Name: "a"})
	requireCode(t, codes.NotFound, err, "namespace nope not found")
	_, err = e.client.ListActions(ctx, &flov1.ListActionsRequest{Namespace: "nope"})
	requireCode(t, codes.NotFound, err, "namespace nope not found")
	_, err = e.client.EnsureActions(ctx, &dispatcherv1.EnsureActionsRequest{Namespace: "nope", Names: []string{"a"}})
	requireCode(t, codes.NotFound, err, "namespace nope not found")
	_, err = e.client.GetNamespace(ctx, &flov1.GetNamespaceRequest{Name: "nope"})
	requireCode(t, codes.NotFound, err, "namespace nope not found")
	_, err = e.client.Claim(ctx, &dispatcherv1.ClaimRequest{Namespace: "nope", Slots: []*dispatcherv1.ClaimSlot{{WorkerId: "w"}}, Actions: []string{"a"}})
	requireCode(t, codes.NotFound, err, "namespace nope not found")
	_, err = e.client.GetTask(ctx, &flov1.GetTaskRequest{Namespace: "nope", TaskId: uuid.NewString()})
	requireCode(t, codes.NotFound, err, "namespace nope not found")

	_, err = e.client.GetAction(ctx, &flov1.GetActionRequest{Namespace: ns, Name: "unknown"})
	requireCode(t, codes.NotFound, err, "action unknown not found")
	_, err = e.client.SetActionEnabled(ctx, &dispatcherv1.SetActionEnabledRequest{Namespace: ns, Name: "unknown"})
	requireCode(t, codes.NotFound, err, "action unknown not found")
	_, err = e.client.ListDeadLetters(ctx, &flov1.ListDeadLettersRequest{Namespace: ns, Action: "unknown"})
	requireCode(t, codes.NotFound, err, "action unknown not found")
	id := uuid.NewString()
	_, err = e.client.GetTask(ctx, &flov1.GetTaskRequest{Namespace: ns, TaskId: id})
	requireCode(t, codes.NotFound, err, "task "+id+" not found")
	_, err = e.client.GetTask(ctx, &flov1.GetTaskRequest{Namespace: ns, TaskId: "not-a-uuid"})
	requireCode(t, codes.InvalidArgument, err, "task_id")

	invalid := []struct {
		name  string
		req   *flov1.RegisterActionRequest
		field string
	}{
		{"bad name", &flov1.RegisterActionRequest{Name: "-starts-with-dash"}, "name"},
		{"slash in name", &flov1.RegisterActionRequest{Name: "a/b"}, "name"},
		{"timeout too short", &flov1.RegisterActionRequest{Name: "a", TimeoutMs: 50}, "timeout_ms"},
		{"timeout too long", &flov1.RegisterActionRequest{Name: "a", TimeoutMs: 25 * 3600 * 1000}, "timeout_ms"},
		{"negative attempts", &flov1.RegisterActionRequest{Name: "a", MaxAttempts: -1}, "max_attempts"},
		{"too many attempts", &flov1.RegisterActionRequest{Name: "a", MaxAttempts: 1001}, "max_attempts"},
		{"unknown backoff kind", &flov1.RegisterActionRequest{Name: "a", Backoff: &flov1.Backoff{Kind: 99}}, "backoff.kind"},
		{"negative initial", &flov1.RegisterActionRequest{Name: "a", Backoff: &flov1.Backoff{Kind: flov1.BackoffKind_BACKOFF_KIND_CONSTANT, InitialDelayMs: -1}}, "backoff.initial_delay_ms"},
		{"max below initial", &flov1.RegisterActionRequest{Name: "a", Backoff: &flov1.Backoff{Kind: flov1.BackoffKind_BACKOFF_KIND_LINEAR, InitialDelayMs: 2000, MaxDelayMs: 1000}}, "backoff.max_delay_ms"},
		{"multiplier below one", &flov1.RegisterActionRequest{Name: "a", Backoff: &flov1.Backoff{Kind: flov1.BackoffKind_BACKOFF_KIND_EXPONENTIAL, InitialDelayMs: 10, MaxDelayMs: 1000, Multiplier: 0.5}}, "backoff.multiplier"},
	}
	for _, tt := range invalid {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Namespace = ns
			_, err := e.client.RegisterAction(t.Context(), tt.req)
			requireCode(t, codes.InvalidArgument, err, tt.field)
		})
	}
	// Nothing invalid was created.
	list, err := e.client.ListActions(ctx, &flov1.ListActionsRequest{Namespace: ns})
	require.NoError(t, err)
	require.Len(t, list.GetActions(), 1)

	_, err = e.client.Claim(ctx, &dispatcherv1.ClaimRequest{Namespace: ns, Slots: []*dispatcherv1.ClaimSlot{{WorkerId: "w"}}})
	requireCode(t, codes.InvalidArgument, err, "actions")
	_, err = e.client.Claim(ctx, &dispatcherv1.ClaimRequest{Namespace: ns, Actions: []string{"known"}})
	requireCode(t, codes.InvalidArgument, err, "slots")
	_, err = e.client.Claim(ctx, &dispatcherv1.ClaimRequest{Namespace: ns, Actions: []string{"known"}, Slots: []*dispatcherv1.ClaimSlot{{WorkerId: ""}}})
	requireCode(t, codes.InvalidArgument, err, "slots[0].worker_id")
	_, err = e.client.ListDeadLetters(ctx, &flov1.ListDeadLettersRequest{Namespace: ns, Limit: -1})
	requireCode(t, codes.InvalidArgument, err, "limit")

	// A task that is not dead-lettered cannot be requeued.
	taskID := e.invoke(t, ns, "known", `{}`)
	_, err = e.client.RequeueDeadLetter(ctx, &flov1.GetTaskRequest{Namespace: ns, TaskId: taskID})
	requireCode(t, codes.FailedPrecondition, err, "not dead-lettered")
}

func testActions(t *testing.T, e *env) {
	ctx := t.Context()
	ns := e.namespace(t)

	again, err := e.client.CreateNamespace(ctx, &flov1.CreateNamespaceRequest{Name: ns})
	require.NoError(t, err, "creating an existing namespace returns it")
	require.Equal(t, ns, again.GetName())
	all, err := e.client.ListNamespaces(ctx, &flov1.ListNamespacesRequest{})
	require.NoError(t, err)
	var names []string
	for _, n := range all.GetNamespaces() {
		names = append(names, n.GetName())
	}
	require.Contains(t, names, "default", "bootstrap namespace")
	require.Contains(t, names, "spaced", "bootstrap names are trimmed")
	require.Contains(t, names, ns)

	a := e.register(t, ns, "defaults", nil)
	require.Equal(t, int64(5*60*1000), a.GetTimeoutMs())
	require.Equal(t, int32(3), a.GetMaxAttempts())
	require.Equal(t, flov1.BackoffKind_BACKOFF_KIND_EXPONENTIAL, a.GetBackoff().GetKind())
	require.Equal(t, int64(1000), a.GetBackoff().GetInitialDelayMs())
	require.Equal(t, int64(5*60*1000), a.GetBackoff().GetMaxDelayMs())
	require.InDelta(t, 2.0, a.GetBackoff().GetMultiplier(), 0)
	require.True(t, a.GetEnabled())

	custom := e.register(t, ns, "custom", &flov1.RegisterActionRequest{TimeoutMs: 1500, MaxAttempts: 7,
		Backoff: &flov1.Backoff{Kind: flov1.BackoffKind_BACKOFF_KIND_LINEAR, InitialDelayMs: 100, MaxDelayMs: 900}})
	require.Equal(t, int64(1500), custom.GetTimeoutMs())
	require.Equal(t, int32(7), custom.GetMaxAttempts())
	require.Equal(t, flov1.BackoffKind_BACKOFF_KIND_LINEAR, custom.GetBackoff().GetKind())
	require.Equal(t, int64(900), custom.GetBackoff().GetMaxDelayMs())

	// Re-registering replaces settings.
	updated := e.register(t, ns, "custom", &flov1.RegisterActionRequest{MaxAttempts: 2})
	require.Equal(t, int32(2), updated.GetMaxAttempts())
	require.Equal(t, int64(5*60*1000), updated.GetTimeoutMs())
	require.Equal(t, custom.GetCreatedAt().AsTime(), updated.GetCreatedAt().AsTime())

	// EnsureActions creates missing ones with defaults and leaves others alone.
	ensured, err := e.client.EnsureActions(ctx, &dispatcherv1.EnsureActionsRequest{Namespace: ns, Names: []string{"custom", "fresh", "fresh"}})
	require.NoError(t, err)
	require.Len(t, ensured.GetActions(), 2)
	require.Equal(t, "custom", ensured.GetActions()[0].GetName())
	require.Equal(t, int32(2), ensured.GetActions()[0].GetMaxAttempts())
	require.Equal(t, "fresh", ensured.GetActions()[1].GetName())
	require.Equal(t, int32(3), ensured.GetActions()[1].GetMaxAttempts())

	disabled, err := e.client.SetActionEnabled(ctx, &dispatcherv1.SetActionEnabledRequest{Namespace: ns, Name: "fresh", Enabled: false})
	require.NoError(t, err)
	require.False(t, disabled.GetEnabled())
	got, err := e.client.GetAction(ctx, &flov1.GetActionRequest{Namespace: ns, Name: "fresh"})
	require.NoError(t, err)
	require.False(t, got.GetEnabled())

	list, err := e.client.ListActions(ctx, &flov1.ListActionsRequest{Namespace: ns})
	require.NoError(t, err)
	require.Len(t, list.GetActions(), 3)
	require.Equal(t, []string{"custom", "defaults", "fresh"}, []string{list.GetActions()[0].GetName(), list.GetActions()[1].GetName(), list.GetActions()[2].GetName()})
}

func testCommands(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "work", &flov1.RegisterActionRequest{MaxAttempts: 4, TimeoutMs: 2000})

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	headers := []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-" + traceID + "-00f067aa0ba902b7-01")}}
	var cmds []*eventsv1.InvokeTask
	for i := range 50 {
		cmds = append(cmds, &eventsv1.InvokeTask{Namespace: ns, Action: "work", Payload: []byte(`{"n":` + string(rune('0'+i%10)) + `}`), Priority: int32(i % 3)})
	}
	// Undecodable records are dropped and unknown actions rejected without blocking
	// the partition: the valid commands behind them still arrive.
	require.NoError(t, e.producer.ProduceSync(t.Context(), &kgo.Record{Topic: kafka.CommandsTopic, Key: []byte("k"), Value: []byte("not protobuf \xff")}).FirstErr())
	unknown := &eventsv1.InvokeTask{Namespace: ns, Action: "missing"}
	e.produce(t, "", nil, unknown)
	e.produce(t, "", headers, cmds...)

	for _, c := range cmds {
		task := e.waitTask(t, ns, c.GetTaskId())
		require.Equal(t, stQueued, task.GetStatus())
		require.Equal(t, int32(4), task.GetMaxAttempts(), "settings are copied onto the task")
		require.Equal(t, c.GetPayload(), task.GetPayload())
		require.Equal(t, c.GetPriority(), task.GetPriority())
		require.Equal(t, c.GetInvokedAt().AsTime().UnixMicro(), task.GetCreatedAt().AsTime().UnixMicro())
		evs := e.events.waitEvents(t, c.GetTaskId(), evCreated)
		require.Equal(t, stQueued, evs[0].GetStatus())
		require.Equal(t, ns, evs[0].GetNamespace())
		require.Equal(t, "work", evs[0].GetAction())
		require.NotEmpty(t, evs[0].GetEventId())
		recs := e.events.records(c.GetTaskId())
		require.Equal(t, c.GetTaskId(), string(recs[0].Key))
		require.Contains(t, headerValue(recs[0], "traceparent"), traceID, "events carry the invoker's trace")
	}
	_, err := e.client.GetTask(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: unknown.GetTaskId()})
	requireCode(t, codes.NotFound, err, "not found")

	// The worker gets the invoker's trace context, and tasks come out
	// highest priority first.
	got := e.claim(t, ns, []string{"work"}, 100, 0, 0)
	require.Len(t, got, 50)
	for i, a := range got {
		require.Contains(t, a.GetTraceContext()["traceparent"], traceID)
		require.Equal(t, int32(1), a.GetAttempt())
		require.Equal(t, int32(4), a.GetMaxAttempts())
		require.NotNil(t, a.GetCreatedAt())
		require.WithinDuration(t, time.Now().Add(2*time.Second), a.GetLeaseUntil().AsTime(), 2*time.Second, "lease defaults to the action timeout")
		if i > 0 {
			require.LessOrEqual(t, priorityOf(cmds, a.GetTaskId()), priorityOf(cmds, got[i-1].GetTaskId()))
		}
	}
}

// samePartition returns a new task id in the partition of id.
func samePartition(id string) string {
	for {
		other := uuid.NewString()
		if kafka.PartitionOf(other, partitions) == kafka.PartitionOf(id, partitions) {
			return other
		}
	}
}

func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func priorityOf(cmds []*eventsv1.InvokeTask, id string) int32 {
	for _, c := range cmds {
		if c.GetTaskId() == id {
			return c.GetPriority()
		}
	}
	return -1
}

func testIdempotentInsert(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "once", nil)
	id := uuid.NewString()
	first := &eventsv1.InvokeTask{TaskId: id, Namespace: ns, Action: "once", Payload: []byte(`"first"`), IdempotencyKey: "k1"}
	second := &eventsv1.InvokeTask{TaskId: id, Namespace: ns, Action: "once", Payload: []byte(`"second"`), IdempotencyKey: "k1"}
	// A marker in the task's partition, handled in order, so once the
	// marker exists the duplicates have been handled too.
	marker := &eventsv1.InvokeTask{Namespace: ns, Action: "once", TaskId: samePartition(id)}
	third := &eventsv1.InvokeTask{TaskId: id, Namespace: ns, Action: "once", Payload: []byte(`"third"`), IdempotencyKey: "k1"}
	e.produce(t, "", nil, first)
	e.produce(t, "", nil, second, third, marker)
	e.waitTask(t, ns, marker.GetTaskId())
	e.events.waitEvents(t, marker.GetTaskId(), evCreated)

	task := e.task(t, ns, id)
	require.Equal(t, `"first"`, string(task.GetPayload()))
	require.Equal(t, "k1", task.GetIdempotencyKey())
	require.Equal(t, []eventsv1.TaskEventType{evCreated}, types(e.events.of(id)))
}

func testCompleted(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "ok", nil)
	id := e.invoke(t, ns, "ok", `{"x":1}`)

	a := e.claimOne(t, ns, "ok", 0)
	require.Equal(t, id, a.GetTaskId())
	require.Equal(t, `{"x":1}`, string(a.GetPayload()))
	running := e.task(t, ns, id)
	require.Equal(t, stRunning, running.GetStatus())
	require.Equal(t, "w1", running.GetWorkerId())
	require.NotNil(t, running.GetStartedAt())

	require.Empty(t, e.report(t, ns, completed(a, `{"total":42,"items":["a"]}`, "shipped")))
	task := e.task(t, ns, id)
	require.Equal(t, stCompleted, task.GetStatus())
	require.Equal(t, `{"total":42,"items":["a"]}`, string(task.GetResult()))
	require.Equal(t, "shipped", task.GetOutcome())
	require.InDelta(t, 42.0, task.GetOutput().GetStructValue().GetFields()["total"].GetNumberValue(), 0)
	require.NotNil(t, task.GetFinishedAt())
	require.Equal(t, int32(1), task.GetAttempt())

	evs := e.events.waitEvents(t, id, evCreated, evStarted, evCompleted)
	require.Equal(t, "w1", evs[1].GetWorkerId())
	require.Equal(t, stRunning, evs[1].GetStatus())
	require.Equal(t, "shipped", evs[2].GetOutcome())
	require.Equal(t, stCompleted, evs[2].GetStatus())

	// A second report of a finished attempt, a wrong attempt, an unknown or
	// malformed id, or a report of no kind is rejected and changes nothing.
	stale := completed(a, `"again"`, "")
	wrongAttempt := completed(a, `"x"`, "")
	wrongAttempt.Attempt = 2
	unknown := &dispatcherv1.Report{TaskId: uuid.NewString(), Attempt: 1, Kind: &dispatcherv1.Report_Abandon{Abandon: &flov1.Abandon{}}}
	malformed := &dispatcherv1.Report{TaskId: "nope", Attempt: 1, Kind: &dispatcherv1.Report_Abandon{Abandon: &flov1.Abandon{}}}
	noKind := &dispatcherv1.Report{TaskId: id, Attempt: 1}
	rejected := e.report(t, ns, stale, wrongAttempt, unknown, malformed, noKind)
	require.ElementsMatch(t, []string{id, id, unknown.GetTaskId(), "nope", id}, rejected)
	require.Equal(t, `{"total":42,"items":["a"]}`, string(e.task(t, ns, id).GetResult()))

	// A plain-text result has no JSON output.
	id2 := e.invoke(t, ns, "ok", `{}`)
	a2 := e.claimOne(t, ns, "ok", 0)
	require.Equal(t, id2, a2.GetTaskId())
	require.Empty(t, e.report(t, ns, completed(a2, "plain text", "")))
	require.Nil(t, e.task(t, ns, id2).GetOutput())
}

func testRetryThenDeadLetter(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "flaky", &flov1.RegisterActionRequest{MaxAttempts: 3,
		Backoff: &flov1.Backoff{Kind: flov1.BackoffKind_BACKOFF_KIND_EXPONENTIAL, InitialDelayMs: 40, MaxDelayMs: 1000, Multiplier: 3}})
	id := e.invoke(t, ns, "flaky", `{}`)

	wantDelays := []time.Duration{40 * time.Millisecond, 120 * time.Millisecond}
	for attempt := int32(1); attempt <= 3; attempt++ {
		a := e.claimOne(t, ns, "flaky", 0)
		require.Equal(t, id, a.GetTaskId())
		require.Equal(t, attempt, a.GetAttempt(), "attempt grows")
		require.Empty(t, e.report(t, ns, failed(a, "boom "+string(rune('0'+attempt)), true, false)))
		task := e.task(t, ns, id)
		if attempt < 3 {
			require.Equal(t, stQueued, task.GetStatus())
			require.Equal(t, attempt, task.GetAttempt())
			require.Equal(t, "boom "+string(rune('0'+attempt)), task.GetError())
			// The retry is scheduled the backoff delay after the failure.
			require.Equal(t, wantDelays[attempt-1], task.GetRunAt().AsTime().Sub(task.GetUpdatedAt().AsTime()))
			continue
		}
		require.Equal(t, stDead, task.GetStatus())
		require.Equal(t, "boom 3", task.GetError())
		require.NotNil(t, task.GetFinishedAt())
	}
	evs := e.events.waitEvents(t, id, evCreated, evStarted, evRetry, evStarted, evRetry, evStarted, evDead)
	require.Equal(t, stQueued, evs[2].GetStatus())
	require.Equal(t, "boom 1", evs[2].GetError())
	require.Equal(t, int32(3), evs[6].GetAttempt())

	dead, err := e.client.ListDeadLetters(t.Context(), &flov1.ListDeadLettersRequest{Namespace: ns})
	require.NoError(t, err)
	require.Len(t, dead.GetTasks(), 1)
	require.Equal(t, id, dead.GetTasks()[0].GetId())
	dead, err = e.client.ListDeadLetters(t.Context(), &flov1.ListDeadLettersRequest{Namespace: ns, Action: "flaky", Limit: 1000})
	require.NoError(t, err)
	require.Len(t, dead.GetTasks(), 1)
}

func testNonRetryable(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "strict", nil)
	id := e.invoke(t, ns, "strict", `{}`)
	a := e.claimOne(t, ns, "strict", 0)
	require.Empty(t, e.report(t, ns, failed(a, "invalid input", true, true)))
	task := e.task(t, ns, id)
	require.Equal(t, stFailed, task.GetStatus())
	require.Equal(t, int32(1), task.GetAttempt())
	require.Equal(t, "invalid input", task.GetError())
	require.False(t, task.GetTimedOut())
	evs := e.events.waitEvents(t, id, evCreated, evStarted, evFailed)
	require.False(t, evs[2].GetTimedOut())
	dead, err := e.client.ListDeadLetters(t.Context(), &flov1.ListDeadLettersRequest{Namespace: ns})
	require.NoError(t, err)
	require.Empty(t, dead.GetTasks())
}

func testRetryFalse(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "fatal", nil)
	id := e.invoke(t, ns, "fatal", `{}`)
	a := e.claimOne(t, ns, "fatal", 0)
	require.Empty(t, e.report(t, ns, failed(a, "give up", false, false)))
	task := e.task(t, ns, id)
	require.Equal(t, stDead, task.GetStatus())
	require.Equal(t, int32(1), task.GetAttempt())
	e.events.waitEvents(t, id, evCreated, evStarted, evDead)
	dead, err := e.client.ListDeadLetters(t.Context(), &flov1.ListDeadLettersRequest{Namespace: ns, Action: "fatal"})
	require.NoError(t, err)
	require.Len(t, dead.GetTasks(), 1)
}

func testNack(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "busy", &flov1.RegisterActionRequest{MaxAttempts: 2})
	id := e.invoke(t, ns, "busy", `{}`)
	a := e.claimOne(t, ns, "busy", 0)
	nack := &dispatcherv1.Report{TaskId: id, Attempt: a.GetAttempt(), Kind: &dispatcherv1.Report_Nack{Nack: &flov1.Nack{DelayMs: 150, Reason: "rate limited"}}}
	require.Empty(t, e.report(t, ns, nack))
	task := e.task(t, ns, id)
	require.Equal(t, stQueued, task.GetStatus())
	require.Equal(t, int32(1), task.GetAttempt(), "a nack counts the attempt")
	require.Equal(t, "rate limited", task.GetError())
	require.Equal(t, 150*time.Millisecond, task.GetRunAt().AsTime().Sub(task.GetUpdatedAt().AsTime()))

	// The delayed task is handed out once its time comes.
	a2 := e.claimOne(t, ns, "busy", 0)
	require.Equal(t, id, a2.GetTaskId())
	require.Equal(t, int32(2), a2.GetAttempt())
	// The last attempt's nack dead-letters.
	nack.Attempt = 2
	require.Empty(t, e.report(t, ns, nack))
	require.Equal(t, stDead, e.task(t, ns, id).GetStatus())
	e.events.waitEvents(t, id, evCreated, evStarted, evRetry, evStarted, evDead)
}

// A failure's error code is on the task and its event; a nack clears it; an
// invalid code is dropped with a note in the error, and a completion clears it.
func testErrorCode(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "coded", &flov1.RegisterActionRequest{MaxAttempts: 4})
	id := e.invoke(t, ns, "coded", `{}`)
	withCode := func(a *flov1.TaskAssignment, msg, code string) *dispatcherv1.Report {
		r := failed(a, msg, true, false)
		r.GetFailed().ErrorCode = code
		return r
	}
	a := e.claimOne(t, ns, "coded", 0)
	require.Empty(t, e.report(t, ns, withCode(a, "busy", "rate_limited")))
	require.Equal(t, "rate_limited", e.task(t, ns, id).GetErrorCode())

	a = e.claimOne(t, ns, "coded", 0)
	nack := &dispatcherv1.Report{TaskId: id, Attempt: a.GetAttempt(), Kind: &dispatcherv1.Report_Nack{Nack: &flov1.Nack{Reason: "later"}}}
	require.Empty(t, e.report(t, ns, nack))
	require.Empty(t, e.task(t, ns, id).GetErrorCode(), "a nack clears the code")

	a = e.claimOne(t, ns, "coded", 0)
	require.Empty(t, e.report(t, ns, withCode(a, "declined", "card declined")), "an invalid code does not refuse the report")
	task := e.task(t, ns, id)
	require.Empty(t, task.GetErrorCode())
	require.Equal(t, `declined [dropped: error code "card declined" is invalid: use 1 to 64 letters, digits, '_', '.', ':' or '-', not starting with '.', ':' or '-']`, task.GetError())

	a = e.claimOne(t, ns, "coded", 0)
	require.Empty(t, e.report(t, ns, completed(a, `{}`, "")))
	require.Empty(t, e.task(t, ns, id).GetErrorCode(), "a completion clears the code")
	evs := e.events.waitEvents(t, id, evCreated, evStarted, evRetry, evStarted, evRetry, evStarted, evRetry, evStarted, evCompleted)
	require.Equal(t, "rate_limited", evs[2].GetErrorCode())
	require.Empty(t, evs[4].GetErrorCode())
	require.Empty(t, evs[6].GetErrorCode())
	require.Empty(t, evs[8].GetErrorCode())
}

func testAbandon(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "handoff", &flov1.RegisterActionRequest{MaxAttempts: 1})
	id := e.invoke(t, ns, "handoff", `{}`)
	for range 3 {
		a := e.claimOne(t, ns, "handoff", 0)
		require.Equal(t, int32(1), a.GetAttempt(), "abandoning does not count an attempt")
		abandon := &dispatcherv1.Report{TaskId: id, Attempt: a.GetAttempt(), Kind: &dispatcherv1.Report_Abandon{Abandon: &flov1.Abandon{}}}
		require.Empty(t, e.report(t, ns, abandon))
		task := e.task(t, ns, id)
		require.Equal(t, stQueued, task.GetStatus())
		require.Equal(t, int32(0), task.GetAttempt())
	}
	a := e.claimOne(t, ns, "handoff", 0)
	require.Empty(t, e.report(t, ns, completed(a, `"done"`, "")))
	e.events.waitEvents(t, id, evCreated, evStarted, evAbandoned, evStarted, evAbandoned, evStarted, evAbandoned, evStarted, evCompleted)
}

func testLeaseExpiry(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "slow", &flov1.RegisterActionRequest{MaxAttempts: 2})
	id := e.invoke(t, ns, "slow", `{}`)

	a := e.claimOne(t, ns, "slow", 100*time.Millisecond)
	require.Equal(t, int32(1), a.GetAttempt())
	// The worker goes silent; the lease runs out and the task is requeued
	// with the attempt counted, then handed to another claim.
	a2 := e.claimOne(t, ns, "slow", 100*time.Millisecond)
	require.Equal(t, id, a2.GetTaskId())
	require.Equal(t, int32(2), a2.GetAttempt())
	// The silent worker's late result is refused.
	require.Equal(t, []string{id}, e.report(t, ns, completed(a, `"late"`, "")))

	// The last attempt's lease running out dead-letters the task.
	task := e.waitStatus(t, ns, id, stDead)
	require.Equal(t, "lease expired", task.GetError())
	require.Equal(t, int32(2), task.GetAttempt())
	require.True(t, task.GetTimedOut(), "a lease that ran out is a timeout")
	evs := e.events.waitEvents(t, id, evCreated, evStarted, evExpired, evStarted, evExpired, evDead)
	require.Equal(t, stQueued, evs[2].GetStatus())
	require.Equal(t, stDead, evs[4].GetStatus())
	require.True(t, evs[5].GetTimedOut(), "the final event says the task timed out")
}

func testTouch(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "long", nil)
	id := e.invoke(t, ns, "long", `{}`)
	a := e.claimOne(t, ns, "long", 500*time.Millisecond)

	// Keep touching for several lease lengths: the task stays ours.
	deadline := time.Now().Add(1500 * time.Millisecond)
	last := a.GetLeaseUntil().AsTime()
	for time.Now().Before(deadline) {
		ack, err := e.client.Touch(t.Context(), &dispatcherv1.TouchRequest{Namespace: ns, WorkerId: "w1", TaskId: id, Attempt: a.GetAttempt(), ExtendMs: 500})
		require.NoError(t, err)
		require.True(t, ack.GetOk(), ack.GetError())
		require.False(t, ack.GetLeaseUntil().AsTime().Before(last), "touch moves the lease forward")
		last = ack.GetLeaseUntil().AsTime()
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, stRunning, e.task(t, ns, id).GetStatus())
	require.Empty(t, e.report(t, ns, completed(a, `"done"`, "")))
	e.events.waitEvents(t, id, evCreated, evStarted, evCompleted)

	// Touching an attempt that is not running is refused.
	ack, err := e.client.Touch(t.Context(), &dispatcherv1.TouchRequest{Namespace: ns, WorkerId: "w1", TaskId: id, Attempt: a.GetAttempt(), ExtendMs: 300})
	require.NoError(t, err)
	require.False(t, ack.GetOk())
	require.NotEmpty(t, ack.GetError())
	ack, err = e.client.Touch(t.Context(), &dispatcherv1.TouchRequest{Namespace: ns, WorkerId: "w1", TaskId: "bad", Attempt: 1})
	require.NoError(t, err)
	require.False(t, ack.GetOk())
	require.Contains(t, ack.GetError(), "task_id")
}

func testRequeue(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "fixme", &flov1.RegisterActionRequest{MaxAttempts: 1})
	id := e.invoke(t, ns, "fixme", `{}`)
	a := e.claimOne(t, ns, "fixme", 0)
	require.Empty(t, e.report(t, ns, failed(a, "bug", true, false)))
	require.Equal(t, stDead, e.task(t, ns, id).GetStatus())

	task, err := e.client.RequeueDeadLetter(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: id})
	require.NoError(t, err)
	require.Equal(t, stQueued, task.GetStatus())
	require.Equal(t, int32(0), task.GetAttempt())
	require.Empty(t, task.GetError())
	require.Nil(t, task.GetFinishedAt())

	a2 := e.claimOne(t, ns, "fixme", 0)
	require.Equal(t, id, a2.GetTaskId())
	require.Equal(t, int32(1), a2.GetAttempt())
	require.Empty(t, e.report(t, ns, completed(a2, `"fixed"`, "")))
	require.Equal(t, stCompleted, e.task(t, ns, id).GetStatus())
	e.events.waitEvents(t, id, evCreated, evStarted, evDead, evRequeued, evStarted, evCompleted)

	_, err = e.client.RequeueDeadLetter(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: id})
	requireCode(t, codes.FailedPrecondition, err, "completed")
	_, err = e.client.RequeueDeadLetter(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: uuid.NewString()})
	requireCode(t, codes.NotFound, err, "not found")
}

func testClaimWaits(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "later", nil)
	e.register(t, ns, "other", nil)

	// Nothing queued: a claim without wait returns nothing at once.
	require.Empty(t, e.claim(t, ns, []string{"later"}, 5, 0, 0))

	got := make(chan []*flov1.TaskAssignment, 1)
	go func() {
		resp, err := e.client.Claim(t.Context(), &dispatcherv1.ClaimRequest{Namespace: ns, Slots: []*dispatcherv1.ClaimSlot{{WorkerId: "w2", Count: 5}}, Actions: []string{"later", "other"}, WaitMs: waitFor.Milliseconds()})
		if err != nil {
			got <- nil
			return
		}
		got <- resp.GetTasks()
	}()
	id := e.invoke(t, ns, "other", `{}`)
	select {
	case tasks := <-got:
		require.Len(t, tasks, 1)
		require.Equal(t, id, tasks[0].GetTaskId())
	case <-time.After(waitFor):
		t.Fatal("waiting claim was not served")
	}
}

// A waiting claim with an id is ended by EndClaim and answers at once; ids
// are checked, and one id names one waiting claim.
func testEndClaim(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "endable", nil)
	claim := func(id string, wait time.Duration) (*dispatcherv1.ClaimResponse, error) {
		return e.client.Claim(t.Context(), &dispatcherv1.ClaimRequest{Namespace: ns, Slots: []*dispatcherv1.ClaimSlot{{WorkerId: "w", Count: 1}},
			Actions: []string{"endable"}, WaitMs: wait.Milliseconds(), ClaimId: id})
	}
	end := func(id string) bool {
		resp, err := e.client.EndClaim(t.Context(), &dispatcherv1.EndClaimRequest{ClaimId: id})
		require.NoError(t, err)
		return resp.GetEnded()
	}
	id := uuid.NewString()
	var done chan error
	wait := func() {
		done = make(chan error, 1)
		go func() {
			resp, err := claim(id, time.Hour)
			if err == nil && len(resp.GetTasks()) > 0 {
				err = fmt.Errorf("%d tasks from an empty queue", len(resp.GetTasks()))
			}
			done <- err
		}()
	}
	wait()
	// Another claim with the same id is refused while the first waits.
	var early error
	require.Eventually(t, func() bool {
		_, err := claim(id, time.Millisecond)
		select {
		case err := <-done:
			if status.Code(err) != codes.InvalidArgument {
				early = fmt.Errorf("the waiting claim answered before it was ended: %v", err)
				return true
			}
			// The probe came first, and the long claim was the one
			// refused: it waits again, and the probe is sent again.
			wait()
			return false
		default:
		}
		return status.Code(err) == codes.InvalidArgument
	}, waitFor, 5*time.Millisecond)
	require.NoError(t, early)
	require.True(t, end(id), "the waiting claim is found")
	select {
	case err := <-done:
		require.NoError(t, err, "an ended claim answers, empty")
	case <-time.After(waitFor):
		t.Fatal("the ended claim went on waiting")
	}
	require.False(t, end(id), "an answered claim is not found again")

	// Claims after it are served as before, under the same id too.
	task := e.invoke(t, ns, "endable", `{}`)
	resp, err := claim(id, waitFor)
	require.NoError(t, err)
	require.Len(t, resp.GetTasks(), 1)
	require.Equal(t, task, resp.GetTasks()[0].GetTaskId())

	_, err = e.client.EndClaim(t.Context(), &dispatcherv1.EndClaimRequest{ClaimId: "a\x00b"})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	_, err = claim(strings.Repeat("k", 257), time.Millisecond)
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
}

func testClaimSlots(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "spread", nil)
	slots := []*dispatcherv1.ClaimSlot{{WorkerId: "a", Count: 3}, {WorkerId: "b", Count: 1}, {WorkerId: "c", Count: 2}}
	claim := func(wait time.Duration) (*dispatcherv1.ClaimResponse, error) {
		resp, err := e.client.Claim(t.Context(), &dispatcherv1.ClaimRequest{Namespace: ns, Slots: slots, Actions: []string{"spread"}, WaitMs: wait.Milliseconds()})
		if err == nil && len(resp.GetWorkerIds()) != len(resp.GetTasks()) {
			err = fmt.Errorf("%d worker ids for %d tasks", len(resp.GetWorkerIds()), len(resp.GetTasks()))
		}
		return resp, err
	}
	countOf := func(resp *dispatcherv1.ClaimResponse) map[string]int {
		n := map[string]int{}
		for _, w := range resp.GetWorkerIds() {
			n[w]++
		}
		return n
	}

	// A claim, waiting or not when they come, leases a burst to its
	// workers in turn.
	got := make(chan *dispatcherv1.ClaimResponse, 1)
	go func() {
		resp, err := claim(waitFor)
		if err != nil {
			t.Errorf("waiting claim: %v", err)
		}
		got <- resp
	}()
	var ids []string
	for range 3 {
		ids = append(ids, e.invoke(t, ns, "spread", `{}`))
	}
	var first *dispatcherv1.ClaimResponse
	select {
	case first = <-got:
	case <-time.After(waitFor):
		t.Fatal("waiting claim was not served")
	}
	require.NotEmpty(t, first.GetTasks())
	for w, n := range countOf(first) {
		require.Equal(t, 1, n, "worker %s got more than one of a burst of three (%v)", w, countOf(first))
	}
	for _, task := range first.GetTasks() {
		require.Contains(t, ids, task.GetTaskId())
	}

	// Ready tasks are leased the same way at once, at most each slot's count.
	for range 10 {
		e.waitTask(t, ns, e.invoke(t, ns, "spread", `{}`))
	}
	var total map[string]int
	require.Eventually(t, func() bool {
		resp, err := claim(0)
		require.NoError(t, err)
		total = countOf(resp)
		return len(total) > 0
	}, waitFor, tick)
	for w, n := range total {
		require.LessOrEqual(t, n, map[string]int{"a": 3, "b": 1, "c": 2}[w], "worker %s", w)
	}
}

func testPriorityAndDelay(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "p", nil)
	low := &eventsv1.InvokeTask{Namespace: ns, Action: "p", Priority: 1}
	high := &eventsv1.InvokeTask{Namespace: ns, Action: "p", Priority: 9}
	delayed := &eventsv1.InvokeTask{Namespace: ns, Action: "p", Priority: 100, RunAt: timestamppb.New(time.Now().Add(3 * time.Second))}
	e.produce(t, "", nil, low, high, delayed)
	// Each task may sit in its own partition, each applied on its own.
	for _, c := range []*eventsv1.InvokeTask{low, high, delayed} {
		e.waitTask(t, ns, c.GetTaskId())
	}

	first := e.claim(t, ns, []string{"p"}, 10, 0, 0)
	require.Len(t, first, 2, "the delayed task is not claimable yet")
	require.Equal(t, high.GetTaskId(), first[0].GetTaskId())
	require.Equal(t, low.GetTaskId(), first[1].GetTaskId())

	later := e.claimOne(t, ns, "p", 0)
	require.Equal(t, delayed.GetTaskId(), later.GetTaskId())
	require.False(t, e.task(t, ns, delayed.GetTaskId()).GetStartedAt().AsTime().Before(delayed.GetRunAt().AsTime().Truncate(time.Microsecond)))
}

// A claim gets the highest-priority tasks of all the partitions, not the
// first tasks of the partition its turn starts at.
func testPriorityAcrossPartitions(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "p", nil)
	var low, high []*eventsv1.InvokeTask
	for range 40 {
		low = append(low, &eventsv1.InvokeTask{Namespace: ns, Action: "p", Priority: 1})
	}
	e.produce(t, "", nil, low...)
	// Three high ones, each in a partition of its own.
	seen := map[int32]bool{}
	for len(high) < 3 {
		id := uuid.NewString()
		if p := kafka.PartitionOf(id, partitions); !seen[p] {
			seen[p] = true
			high = append(high, &eventsv1.InvokeTask{TaskId: id, Namespace: ns, Action: "p", Priority: 7})
		}
	}
	e.produce(t, "", nil, high...)
	for _, c := range append(slices.Clone(low), high...) {
		e.waitTask(t, ns, c.GetTaskId())
	}
	var want, got []string
	for _, c := range high {
		want = append(want, c.GetTaskId())
	}
	for _, a := range e.claim(t, ns, []string{"p"}, 3, 0, 0) {
		got = append(got, a.GetTaskId())
	}
	require.ElementsMatch(t, want, got)
}

func testDisabled(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "paused", nil)
	_, err := e.client.SetActionEnabled(t.Context(), &dispatcherv1.SetActionEnabledRequest{Namespace: ns, Name: "paused", Enabled: false})
	require.NoError(t, err)
	id := e.invoke(t, ns, "paused", `{}`)
	require.Empty(t, e.claim(t, ns, []string{"paused"}, 1, 100*time.Millisecond, 0), "a disabled action's tasks are not handed out")
	_, err = e.client.SetActionEnabled(t.Context(), &dispatcherv1.SetActionEnabledRequest{Namespace: ns, Name: "paused", Enabled: true})
	require.NoError(t, err)
	require.Equal(t, id, e.claimOne(t, ns, "paused", 0).GetTaskId())
}

func testHTTP(t *testing.T, e *env) {
	get := func(path string) (int, string) { return harness.HTTPGet(t, "http://"+e.svc.HTTPAddr()+path) }
	code, _ := get("/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool { c, _ := get("/readyz"); return c == http.StatusOK }, waitFor, tick)
	code, body := get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "flo_test_metric 1")
}
