package flo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestAdaptHandler(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		handler     any
		wantOutcome string
		wantBody    string
		wantErr     string
	}{
		{
			name:     "bytes handler returns its bytes unchanged",
			handler:  func(*ActionContext) ([]byte, error) { return []byte("not json"), nil },
			wantBody: "not json",
		},
		{
			name:     "bytes handler with nil body",
			handler:  func(*ActionContext) ([]byte, error) { return nil, nil },
			wantBody: "",
		},
		{
			name:     "bytes handler error",
			handler:  func(*ActionContext) ([]byte, error) { return []byte("x"), errors.New("boom") },
			wantErr:  "boom",
			wantBody: "x",
		},
		{
			name: "interface handler value is encoded as JSON",
			handler: func(*ActionContext) (interface{}, error) {
				return map[string]any{"valid": true, "orderId": "o-1"}, nil
			},
			wantBody: `{"orderId":"o-1","valid":true}`,
		},
		{
			name:     "interface handler bytes value is kept raw",
			handler:  func(*ActionContext) (interface{}, error) { return []byte("raw"), nil },
			wantBody: "raw",
		},
		{
			name:     "interface handler nil value has no body",
			handler:  func(*ActionContext) (interface{}, error) { return nil, nil },
			wantBody: "",
		},
		{
			name: "interface handler named outcome",
			handler: func(actx *ActionContext) (interface{}, error) {
				return actx.Result("approved", map[string]string{"decision": "auto-approved"})
			},
			wantOutcome: "approved",
			wantBody:    `{"decision":"auto-approved"}`,
		},
		{
			name:     "interface handler error wins over its value",
			handler:  func(*ActionContext) (interface{}, error) { return "ignored", errors.New("nope") },
			wantErr:  "nope",
			wantBody: "",
		},
		{
			name:     "interface handler value that cannot be encoded fails for good",
			handler:  func(*ActionContext) (interface{}, error) { return make(chan int), nil },
			wantErr:  "encode result: json: unsupported type: chan int",
			wantBody: "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, err := adaptHandler("a", tt.handler)
			require.NoError(t, err)
			outcome, body, err := call(h, &ActionContext{Context: context.Background(), taskID: "t"})
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tt.wantOutcome, outcome)
			require.Equal(t, tt.wantBody, string(body))
		})
	}
}

func TestAdaptHandlerRejectsOtherTypes(t *testing.T) {
	t.Parallel()
	var nilBytes func(*ActionContext) ([]byte, error)
	for _, h := range []any{
		nil,
		"handler",
		func(*ActionContext) error { return nil },
		func(context.Context) ([]byte, error) { return nil, nil },
		func(*ActionContext) (map[string]any, error) { return nil, nil },
		nilBytes,
	} {
		_, err := adaptHandler("send-email", h)
		var unsupported *UnsupportedHandlerError
		require.ErrorAs(t, err, &unsupported, "%T", h)
		require.Equal(t, "send-email", unsupported.Action)
		require.Contains(t, err.Error(), "send-email")
	}
}

func TestCallRecoversPanics(t *testing.T) {
	t.Parallel()
	h, err := adaptHandler("a", func(*ActionContext) ([]byte, error) { panic("boom") })
	require.NoError(t, err)
	_, _, err = call(h, &ActionContext{Context: context.Background()})
	require.EqualError(t, err, "panic: boom")
	var p *panicError
	require.ErrorAs(t, err, &p)
	require.Contains(t, string(p.stack), "TestCallRecoversPanics")
}

func TestReport(t *testing.T) {
	t.Parallel()
	task := &flov1.TaskAssignment{TaskId: "t-1", Attempt: 3}
	tests := []struct {
		name     string
		err      error
		timedOut bool
		want     *flov1.WorkerMessage
	}{
		{
			name: "success",
			want: resultMessage(&flov1.Result{TaskId: "t-1", Attempt: 3, Outcome: &flov1.Result_Completed{
				Completed: &flov1.Completed{Body: []byte("body"), Outcome: "approved"},
			}}),
		},
		{
			name: "plain error is retried",
			err:  errors.New("db down"),
			want: failedMessage("db down", true, false),
		},
		{
			name: "panic is retried",
			err:  &panicError{value: "boom"},
			want: failedMessage("panic: boom", true, false),
		},
		{
			name: "non-retryable fails at once",
			err:  NewNonRetryableErrorf("order amount $%.0f exceeds $2000 limit", 2500.0),
			want: failedMessage("order amount $2500 exceeds $2000 limit", false, true),
		},
		{
			name: "wrapped non-retryable fails at once",
			err:  fmt.Errorf("validate: %w", NewNonRetryableError(errors.New("missing orderId"))),
			want: failedMessage("validate: missing orderId", false, true),
		},
		{
			name: "deadline exceeded fails at once",
			err:  fmt.Errorf("call upstream: %w", context.DeadlineExceeded),
			want: failedMessage("call upstream: context deadline exceeded", false, true),
		},
		{
			name:     "a handler past its deadline fails at once as timed out",
			err:      fmt.Errorf("call upstream: %w", context.DeadlineExceeded),
			timedOut: true,
			want: resultMessage(&flov1.Result{TaskId: "t-1", Attempt: 3, Outcome: &flov1.Result_Failed{
				Failed: &flov1.Failed{Error: "call upstream: context deadline exceeded", NonRetryable: true, TimedOut: true},
			}}),
		},
		{
			name:     "a handler past its deadline whose error is retryable is retried as timed out",
			err:      errors.New("upstream: i/o timeout"),
			timedOut: true,
			want: resultMessage(&flov1.Result{TaskId: "t-1", Attempt: 3, Outcome: &flov1.Result_Failed{
				Failed: &flov1.Failed{Error: "upstream: i/o timeout", Retry: true, TimedOut: true},
			}}),
		},
		{
			name:     "a result that arrives past the deadline still completes",
			timedOut: true,
			want: resultMessage(&flov1.Result{TaskId: "t-1", Attempt: 3, Outcome: &flov1.Result_Completed{
				Completed: &flov1.Completed{Body: []byte("body"), Outcome: "approved"},
			}}),
		},
		{
			name: "cancellation fails at once",
			err:  context.Canceled,
			want: failedMessage("context canceled", false, true),
		},
		{
			name: "dead letter error dead-letters",
			err:  NewDeadLetterErrorf("card %s declined", "4242"),
			want: failedMessage("card 4242 declined", false, false),
		},
		{
			name: "dead letter wins over a wrapped deadline",
			err:  NewDeadLetterError(fmt.Errorf("gave up: %w", context.DeadlineExceeded)),
			want: failedMessage("gave up: context deadline exceeded", false, false),
		},
		{
			name: "a coded error is retried and carries its code",
			err:  fmt.Errorf("charge: %w", NewErrorWithCode("rate_limited", "upstream busy")),
			want: resultMessage(&flov1.Result{TaskId: "t-1", Attempt: 3, Outcome: &flov1.Result_Failed{
				Failed: &flov1.Failed{Error: "charge: upstream busy", Retry: true, ErrorCode: "rate_limited"},
			}}),
		},
		{
			name: "a non-retryable coded error fails at once with its code",
			err:  NewNonRetryableError(NewErrorWithCode("card_declined", "card %s declined", "4242")),
			want: resultMessage(&flov1.Result{TaskId: "t-1", Attempt: 3, Outcome: &flov1.Result_Failed{
				Failed: &flov1.Failed{Error: "card 4242 declined", NonRetryable: true, ErrorCode: "card_declined"},
			}}),
		},
		{
			name: "a pending result waits the default time",
			err:  fmt.Errorf("sent to the carrier: %w", ErrResultPending),
			want: resultMessage(&flov1.Result{TaskId: "t-1", Attempt: 3, Outcome: &flov1.Result_Pending{Pending: &flov1.Pending{}}}),
		},
		{
			name: "a pending result with its own deadline",
			err:  ResultPendingWithin(90 * time.Second),
			want: resultMessage(&flov1.Result{TaskId: "t-1", Attempt: 3, Outcome: &flov1.Result_Pending{Pending: &flov1.Pending{TimeoutMs: 90000}}}),
		},
		{
			name: "a nack drops the code",
			err:  NewNackErrorf(time.Second, "later: %w", NewErrorWithCode("rate_limited", "busy")),
			want: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Nack{Nack: &flov1.Nack{
				TaskId: "t-1", Attempt: 3, DelayMs: 1000, Reason: "later: busy",
			}}},
		},
		{
			name: "abandon",
			err:  fmt.Errorf("shutting down: %w", ErrAbandon),
			want: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Abandon{Abandon: &flov1.Abandon{TaskId: "t-1", Attempt: 3}}},
		},
		{
			name: "nack with delay",
			err:  NewNackErrorf(1500*time.Millisecond, "rate limited by %s", "stripe"),
			want: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Nack{Nack: &flov1.Nack{
				TaskId: "t-1", Attempt: 3, DelayMs: 1500, Reason: "rate limited by stripe",
			}}},
		},
		{
			name: "negative nack delay is clamped",
			err:  NewNackErrorf(-time.Second, "later"),
			want: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Nack{Nack: &flov1.Nack{
				TaskId: "t-1", Attempt: 3, DelayMs: 0, Reason: "later",
			}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := report(task, "approved", []byte("body"), tt.err, tt.timedOut)
			require.Equal(t, tt.want.String(), got.String())
		})
	}
}

func failedMessage(msg string, retry, nonRetryable bool) *flov1.WorkerMessage {
	return resultMessage(&flov1.Result{TaskId: "t-1", Attempt: 3, Outcome: &flov1.Result_Failed{
		Failed: &flov1.Failed{Error: msg, Retry: retry, NonRetryable: nonRetryable},
	}})
}

func TestActionContextHelpers(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	actx := &ActionContext{
		Context:   context.Background(),
		taskID:    "t-9",
		action:    "process-order",
		attempt:   2,
		createdAt: created,
		payload:   []byte(`{"order_id":"o-7","amount":12.5}`),
	}
	var order struct {
		OrderID string  `json:"order_id"`
		Amount  float64 `json:"amount"`
	}
	require.NoError(t, actx.Into(&order))
	require.Equal(t, "o-7", order.OrderID)
	require.InDelta(t, 12.5, order.Amount, 0)
	require.Equal(t, "t-9", actx.TaskID())
	require.Equal(t, "process-order", actx.ActionName())
	require.Equal(t, 2, actx.Attempt())
	require.Equal(t, created, actx.CreatedAt())

	b, err := actx.Bytes(map[string]string{"status": "done"})
	require.NoError(t, err)
	require.JSONEq(t, `{"status":"done"}`, string(b))

	_, err = actx.Bytes(func() {})
	require.ErrorContains(t, err, "encode result of task t-9")

	bad := &ActionContext{taskID: "t-10", payload: []byte("{")}
	require.ErrorContains(t, bad.Into(&order), "decode payload of task t-10")

	empty := &ActionContext{taskID: "t-11"}
	order.OrderID = "kept"
	require.NoError(t, empty.Into(&order))
	require.Equal(t, "kept", order.OrderID)

	v, err := actx.Result("rejected", json.RawMessage(`{"reason":"too high"}`))
	require.NoError(t, err)
	require.Equal(t, &namedOutcome{outcome: "rejected", body: []byte(`{"reason":"too high"}`)}, v)
}

func TestActionContextIsAContext(t *testing.T) {
	t.Parallel()
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	actx := &ActionContext{Context: ctx}
	var c context.Context = actx
	require.Equal(t, "v", c.Value(key{}))
	cancel()
	<-c.Done()
	require.ErrorIs(t, c.Err(), context.Canceled)
}

func TestTaskFromProtoAndJSON(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	task := taskFromProto(&flov1.Task{
		Id:          "t-1",
		Namespace:   "myapp",
		Action:      "process-order",
		Status:      flov1.TaskStatus_TASK_STATUS_COMPLETED,
		Attempt:     2,
		MaxAttempts: 3,
		Payload:     []byte(`{"order_id":"o-1"}`),
		Result:      []byte(`{"status":"done"}`),
		Outcome:     "approved",
		WorkerId:    "w-1",
		CreatedAt:   timestamppb.New(created),
	})
	require.Equal(t, TaskCompleted, task.Status)
	require.True(t, task.Status.Final())
	out, err := json.Marshal(task)
	require.NoError(t, err)
	require.JSONEq(t, `{
		"id": "t-1", "namespace": "myapp", "action": "process-order", "status": "completed",
		"attempt": 2, "max_attempts": 3, "priority": 0,
		"payload": {"order_id": "o-1"}, "result": {"status": "done"}, "outcome": "approved",
		"worker_id": "w-1", "created_at": "2026-03-01T12:00:00Z"
	}`, string(out))

	binary := Task{ID: "t-2", Status: TaskFailed, Result: []byte{0xff, 0x00}, Error: "boom"}
	out, err = json.Marshal(binary)
	require.NoError(t, err)
	require.JSONEq(t, `{
		"id": "t-2", "namespace": "", "action": "", "status": "failed", "attempt": 0,
		"max_attempts": 0, "priority": 0, "result": "/wA=", "error": "boom"
	}`, string(out))
}

func TestTaskStatuses(t *testing.T) {
	t.Parallel()
	for p, want := range map[flov1.TaskStatus]TaskStatus{
		flov1.TaskStatus_TASK_STATUS_QUEUED:        TaskQueued,
		flov1.TaskStatus_TASK_STATUS_RUNNING:       TaskRunning,
		flov1.TaskStatus_TASK_STATUS_COMPLETED:     TaskCompleted,
		flov1.TaskStatus_TASK_STATUS_FAILED:        TaskFailed,
		flov1.TaskStatus_TASK_STATUS_DEAD_LETTERED: TaskDeadLettered,
	} {
		require.Equal(t, want, taskFromProto(&flov1.Task{Status: p}).Status)
	}
	require.False(t, TaskQueued.Final())
	require.False(t, TaskRunning.Final())
	require.True(t, TaskDeadLettered.Final())
	require.Equal(t, TaskStatus("dead_lettered"), TaskDeadLettered)
}

func TestActionJSONAndBackoff(t *testing.T) {
	t.Parallel()
	a := actionFromProto(&flov1.Action{
		Namespace:   "myapp",
		Name:        "send-email",
		TimeoutMs:   30_000,
		MaxAttempts: 5,
		Enabled:     true,
		Backoff: &flov1.Backoff{
			Kind:           flov1.BackoffKind_BACKOFF_KIND_EXPONENTIAL_JITTER,
			InitialDelayMs: 1000,
			MaxDelayMs:     60_000,
			Multiplier:     2,
		},
	})
	require.Equal(t, &Backoff{Kind: BackoffExponentialJitter, Initial: time.Second, Max: time.Minute, Multiplier: 2}, a.Backoff)
	out, err := json.Marshal(a)
	require.NoError(t, err)
	require.JSONEq(t, `{
		"namespace": "myapp", "name": "send-email", "timeout": "30s", "max_attempts": 5,
		"backoff": {"kind": "exponential_jitter", "initial_delay": "1s", "max_delay": "1m0s", "multiplier": 2},
		"enabled": true
	}`, string(out))

	p, err := (&Backoff{Kind: BackoffCapped, Initial: 500 * time.Millisecond, Max: 10 * time.Second, Multiplier: 3}).toProto()
	require.NoError(t, err)
	require.Equal(t, flov1.BackoffKind_BACKOFF_KIND_CAPPED, p.GetKind())
	require.Equal(t, int64(500), p.GetInitialDelayMs())
	require.Equal(t, int64(10_000), p.GetMaxDelayMs())

	p, err = (*Backoff)(nil).toProto()
	require.NoError(t, err)
	require.Nil(t, p)

	_, err = (&Backoff{Kind: "fibonacci"}).toProto()
	require.ErrorContains(t, err, `unknown backoff kind "fibonacci"`)

	for _, k := range []BackoffKind{BackoffConstant, BackoffLinear, BackoffExponential, BackoffExponentialJitter, BackoffCapped} {
		parsed, err := ParseBackoffKind(string(k))
		require.NoError(t, err)
		require.Equal(t, k, parsed)
	}
	_, err = ParseBackoffKind("")
	require.Error(t, err)
}

func TestEncodePayload(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		payload any
		want    string
	}{
		{name: "nil", payload: nil, want: ""},
		{name: "bytes are sent raw", payload: []byte("raw bytes"), want: "raw bytes"},
		{name: "raw JSON is sent raw", payload: json.RawMessage(`{"a":1}`), want: `{"a":1}`},
		{name: "map is JSON", payload: map[string]int{"a": 1}, want: `{"a":1}`},
		{name: "string is a JSON string", payload: "hi", want: `"hi"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := encodePayload(tt.payload)
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}
	_, err := encodePayload(make(chan int))
	require.ErrorContains(t, err, "encode payload")
}

// ErrorCode finds a code anywhere in an error's chain: through fmt.Errorf wrapping, inside and
// outside the retry markers, and the outermost code wins.
func TestErrorCode(t *testing.T) {
	t.Parallel()
	coded := NewErrorWithCode("card_declined", "card %s declined", "4242")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{name: "nil", err: nil, want: ""},
		{name: "plain error", err: errors.New("boom"), want: ""},
		{name: "coded", err: coded, want: "card_declined"},
		{name: "wrapped by fmt.Errorf", err: fmt.Errorf("charge: %w", coded), want: "card_declined"},
		{name: "inside non-retryable", err: NewNonRetryableError(coded), want: "card_declined"},
		{name: "wrapping non-retryable", err: NewErrorWithCode("fraud_detected", "stop: %w", NewNonRetryableErrorf("fraud")), want: "fraud_detected"},
		{name: "inside dead letter", err: NewDeadLetterErrorf("gave up: %w", coded), want: "card_declined"},
		{name: "in a joined error", err: errors.Join(errors.New("a"), coded), want: "card_declined"},
		{name: "outermost wins", err: NewErrorWithCode("rate_limited", "retry: %w", coded), want: "rate_limited"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, ErrorCode(tt.err))
		})
	}
	require.Equal(t, "card 4242 declined", coded.Error())
	var nonRetryable *NonRetryableError
	require.True(t, errors.As(NewErrorWithCode("fraud_detected", "stop: %w", NewNonRetryableErrorf("fraud")), &nonRetryable),
		"a code around a non-retryable error keeps it non-retryable")
}
