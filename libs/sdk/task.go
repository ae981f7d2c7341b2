package flo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TaskStatus is where a task is in its life.
type TaskStatus string

// The states of a task. Completed, failed and dead-lettered are final.
const (
	TaskQueued  TaskStatus = "queued"
	TaskRunning TaskStatus = "running"
	// TaskWaiting: its handler returned ErrResultPending; CompleteTask or FailTask finishes it.
	TaskWaiting      TaskStatus = "waiting"
	TaskCompleted    TaskStatus = "completed"
	TaskFailed       TaskStatus = "failed"
	TaskDeadLettered TaskStatus = "dead_lettered"
)

// Final reports whether the task will not change any more (short of a dead-letter requeue).
func (s TaskStatus) Final() bool {
	return s == TaskCompleted || s == TaskFailed || s == TaskDeadLettered
}

var taskStatuses = map[flov1.TaskStatus]TaskStatus{
	flov1.TaskStatus_TASK_STATUS_QUEUED:        TaskQueued,
	flov1.TaskStatus_TASK_STATUS_RUNNING:       TaskRunning,
	flov1.TaskStatus_TASK_STATUS_WAITING:       TaskWaiting,
	flov1.TaskStatus_TASK_STATUS_COMPLETED:     TaskCompleted,
	flov1.TaskStatus_TASK_STATUS_FAILED:        TaskFailed,
	flov1.TaskStatus_TASK_STATUS_DEAD_LETTERED: TaskDeadLettered,
}

// Task is one invocation of an action and its progress.
type Task struct {
	ID          string
	Namespace   string
	Action      string
	Status      TaskStatus
	Attempt     int
	MaxAttempts int
	Priority    int
	Payload     []byte
	// Result is the body the last successful attempt returned.
	Result []byte
	// Outcome is the named outcome of a completed task; empty means plain success.
	Outcome string
	// Error is the message of the last failed attempt.
	Error string
	// TimedOut says the last attempt that ended ran out of time: its handler passed its deadline, or
	// its worker went silent until its lease expired.
	TimedOut bool
	// ErrorCode is the code of the last failed attempt (see CodedError); empty when it had none.
	ErrorCode      string
	IdempotencyKey string
	WorkerID       string
	CreatedAt      time.Time
	RunAt          time.Time
	StartedAt      time.Time
	FinishedAt     time.Time
	UpdatedAt      time.Time
	// CompleteBy is, while the task is waiting, when it fails as timed out unless it was
	// completed or failed by its completion token first.
	CompleteBy time.Time
}

// MarshalJSON writes payload and result as JSON values when they hold JSON (the common case,
// and what a script reading `flo task get` wants) and as base64 strings otherwise. Empty
// fields and zero times are left out.
func (t Task) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID             string          `json:"id"`
		Namespace      string          `json:"namespace"`
		Action         string          `json:"action"`
		Status         TaskStatus      `json:"status"`
		Attempt        int             `json:"attempt"`
		MaxAttempts    int             `json:"max_attempts"`
		Priority       int             `json:"priority"`
		Payload        json.RawMessage `json:"payload,omitempty"`
		Result         json.RawMessage `json:"result,omitempty"`
		Outcome        string          `json:"outcome,omitempty"`
		Error          string          `json:"error,omitempty"`
		TimedOut       bool            `json:"timed_out,omitempty"`
		ErrorCode      string          `json:"error_code,omitempty"`
		IdempotencyKey string          `json:"idempotency_key,omitempty"`
		WorkerID       string          `json:"worker_id,omitempty"`
		CreatedAt      time.Time       `json:"created_at,omitzero"`
		RunAt          time.Time       `json:"run_at,omitzero"`
		StartedAt      time.Time       `json:"started_at,omitzero"`
		FinishedAt     time.Time       `json:"finished_at,omitzero"`
		UpdatedAt      time.Time       `json:"updated_at,omitzero"`
		CompleteBy     time.Time       `json:"complete_by,omitzero"`
	}{
		ID: t.ID, Namespace: t.Namespace, Action: t.Action, Status: t.Status,
		Attempt: t.Attempt, MaxAttempts: t.MaxAttempts, Priority: t.Priority,
		Payload: jsonOrBase64(t.Payload), Result: jsonOrBase64(t.Result),
		Outcome: t.Outcome, Error: t.Error, TimedOut: t.TimedOut, ErrorCode: t.ErrorCode, IdempotencyKey: t.IdempotencyKey, WorkerID: t.WorkerID,
		CreatedAt: t.CreatedAt, RunAt: t.RunAt, StartedAt: t.StartedAt, FinishedAt: t.FinishedAt,
		UpdatedAt: t.UpdatedAt, CompleteBy: t.CompleteBy,
	})
}

func jsonOrBase64(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	if json.Valid(b) {
		return b
	}
	encoded, _ := json.Marshal(b) // a []byte always marshals, as a base64 string
	return encoded
}

func taskFromProto(t *flov1.Task) *Task {
	return &Task{
		ID:             t.GetId(),
		Namespace:      t.GetNamespace(),
		Action:         t.GetAction(),
		Status:         taskStatuses[t.GetStatus()],
		Attempt:        int(t.GetAttempt()),
		MaxAttempts:    int(t.GetMaxAttempts()),
		Priority:       int(t.GetPriority()),
		Payload:        t.GetPayload(),
		Result:         t.GetResult(),
		Outcome:        t.GetOutcome(),
		Error:          t.GetError(),
		TimedOut:       t.GetTimedOut(),
		ErrorCode:      t.GetErrorCode(),
		IdempotencyKey: t.GetIdempotencyKey(),
		WorkerID:       t.GetWorkerId(),
		CreatedAt:      timeFromProto(t.GetCreatedAt()),
		RunAt:          timeFromProto(t.GetRunAt()),
		StartedAt:      timeFromProto(t.GetStartedAt()),
		FinishedAt:     timeFromProto(t.GetFinishedAt()),
		UpdatedAt:      timeFromProto(t.GetUpdatedAt()),
		CompleteBy:     timeFromProto(t.GetCompleteBy()),
	}
}

// InvokeOption adjusts one invocation.
type InvokeOption func(*flov1.InvokeTaskRequest)

// WithIdempotencyKey makes the invocation idempotent: invoking the same action with the same
// key again returns the task the first call created instead of creating another.
func WithIdempotencyKey(key string) InvokeOption {
	return func(r *flov1.InvokeTaskRequest) { r.IdempotencyKey = key }
}

// WithPriority sets the task's priority; among ready tasks of an action, higher runs first.
func WithPriority(priority int) InvokeOption {
	return func(r *flov1.InvokeTaskRequest) { r.Priority = int32(priority) }
}

// WithDelay makes the task wait d before a worker may run it.
func WithDelay(d time.Duration) InvokeOption {
	return func(r *flov1.InvokeTaskRequest) { r.DelayMs = d.Milliseconds() }
}

// Invoke creates a task of action with payload as its input and returns the task's id.
// A []byte or json.RawMessage payload is sent as it is, nil sends no payload, and anything
// else is encoded as JSON. With an idempotency key, an invocation the gateway answers
// UNAVAILABLE is sent again (up to four times, within about 1.5 s); without one it is not,
// since the first attempt may have created the task.
//
// Calls that overlap are sent together: while a few calls of the client are under way, the
// calls that come meanwhile wait for the first to finish and then go as one InvokeTasks call.
// Each still gets its own task id or error (a gathered call the gateway refuses for one item is
// sent again call by call), and each task joins its own caller's trace. A call that goes alone
// is the InvokeTask it always was.
func (c *Client) Invoke(ctx context.Context, action string, payload any, opts ...InvokeOption) (string, error) {
	body, err := encodePayload(payload)
	if err != nil {
		return "", fmt.Errorf("invoke %s: %w", action, err)
	}
	g, err := c.gatherer()
	if err != nil {
		return "", err
	}
	req := &flov1.InvokeTaskRequest{Namespace: c.namespace, Action: action, Payload: body}
	for _, opt := range opts {
		opt(req)
	}
	id, err := retryKeyed(ctx, req.GetIdempotencyKey(), func() (string, error) {
		return g.invoke(ctx, req)
	})
	if err != nil {
		return "", fmt.Errorf("invoke %s: %w", action, err)
	}
	return id, nil
}

// MaxInvokeBatch is the most payloads one InvokeMany call may carry.
const MaxInvokeBatch = 1000

// InvokeMany creates one task of action per payload in a single call and returns their ids in
// payload order. Payloads are encoded as Invoke encodes its payload, and opts apply to every
// task. The gateway validates everything before queuing anything: a bad item fails the whole
// call and creates no task. At most MaxInvokeBatch payloads, and a few MiB of them in total, fit
// in one call. An idempotency key would make every task of the call the same task, so it is
// refused when there is more than one payload.
func (c *Client) InvokeMany(ctx context.Context, action string, payloads []any, opts ...InvokeOption) ([]string, error) {
	if len(payloads) == 0 {
		return nil, nil
	}
	svc, err := c.taskService()
	if err != nil {
		return nil, err
	}
	tasks := make([]*flov1.InvokeTaskRequest, len(payloads))
	for i, p := range payloads {
		body, err := encodePayload(p)
		if err != nil {
			return nil, fmt.Errorf("invoke %s: payload %d: %w", action, i, err)
		}
		tasks[i] = &flov1.InvokeTaskRequest{Action: action, Payload: body}
		for _, opt := range opts {
			opt(tasks[i])
		}
		if tasks[i].GetIdempotencyKey() != "" && len(payloads) > 1 {
			return nil, fmt.Errorf("invoke %s: an idempotency key names one task, but %d payloads were given", action, len(payloads))
		}
	}
	resp, err := svc.InvokeTasks(ctx, &flov1.InvokeTasksRequest{Namespace: c.namespace, Tasks: tasks})
	if err != nil {
		return nil, fmt.Errorf("invoke %d tasks of %s: %w", len(payloads), action, err)
	}
	return resp.GetTaskIds(), nil
}

func encodePayload(payload any) ([]byte, error) {
	switch p := payload.(type) {
	case nil:
		return nil, nil
	case []byte:
		return p, nil
	case json.RawMessage:
		return p, nil
	default:
		b, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("encode payload: %w", err)
		}
		return b, nil
	}
}

// GetTask returns the task id as it is now.
func (c *Client) GetTask(ctx context.Context, id string) (*Task, error) {
	svc, err := c.taskService()
	if err != nil {
		return nil, err
	}
	t, err := svc.GetTask(ctx, &flov1.GetTaskRequest{Namespace: c.namespace, TaskId: id})
	if err != nil {
		return nil, fmt.Errorf("get task %s: %w", id, err)
	}
	return taskFromProto(t), nil
}

// AwaitTask waits until the task id reaches a final state or timeout passes (zero means the
// server's 30 s, the server allows at most 5 min) and returns the task as it then is, so check
// [TaskStatus.Final] on the result.
func (c *Client) AwaitTask(ctx context.Context, id string, timeout time.Duration) (*Task, error) {
	svc, err := c.taskService()
	if err != nil {
		return nil, err
	}
	t, err := svc.AwaitTask(ctx, &flov1.AwaitTaskRequest{
		Namespace: c.namespace,
		TaskId:    id,
		TimeoutMs: timeout.Milliseconds(),
	})
	if err != nil {
		return nil, fmt.Errorf("await task %s: %w", id, err)
	}
	return taskFromProto(t), nil
}

// ListDeadLetters returns up to limit dead-lettered tasks of action, newest first; an empty
// action means every action, a zero limit every dead letter, fetched a page at a time.
func (c *Client) ListDeadLetters(ctx context.Context, action string, limit int) ([]*Task, error) {
	svc, err := c.taskService()
	if err != nil {
		return nil, err
	}
	return listPages(limit, func(size int32, token string) ([]*flov1.Task, string, error) {
		resp, err := svc.ListDeadLetters(ctx, &flov1.ListDeadLettersRequest{
			Namespace: c.namespace,
			Action:    action,
			Limit:     size,
			PageToken: token,
		})
		if err != nil {
			return nil, "", fmt.Errorf("list dead letters: %w", err)
		}
		return resp.GetTasks(), resp.GetNextPageToken(), nil
	}, taskFromProto)
}

// RequeueDeadLetter puts the dead-lettered task id back in its queue for another round of
// attempts.
func (c *Client) RequeueDeadLetter(ctx context.Context, id string) (*Task, error) {
	svc, err := c.taskService()
	if err != nil {
		return nil, err
	}
	t, err := svc.RequeueDeadLetter(ctx, &flov1.GetTaskRequest{Namespace: c.namespace, TaskId: id})
	if err != nil {
		return nil, fmt.Errorf("requeue dead letter %s: %w", id, err)
	}
	return taskFromProto(t), nil
}

// CompleteTask finishes a task whose handler returned ErrResultPending, successfully: token is
// the attempt's ActionContext.CompletionToken, result the task's result (JSON for a workflow
// step's output) and outcome a named outcome for workflow routing ("" is success). A task
// finishes once: a second call, or one after its async deadline, fails with
// FailedPrecondition; a token no task waits for fails with NotFound.
func (c *Client) CompleteTask(ctx context.Context, token string, result []byte, outcome string) (*Task, error) {
	svc, err := c.taskService()
	if err != nil {
		return nil, err
	}
	t, err := svc.CompleteTask(ctx, &flov1.CompleteTaskRequest{Namespace: c.namespace, Token: token, Result: result, Outcome: outcome})
	if err != nil {
		return nil, fmt.Errorf("complete task by token: %w", err)
	}
	return taskFromProto(t), nil
}

// FailTask finishes a task whose handler returned ErrResultPending with a failure: cause's
// message is the task's error and ErrorCode(cause) its code. The failure is final: no further
// attempt runs, whatever attempts remain. It answers a second call as CompleteTask does.
func (c *Client) FailTask(ctx context.Context, token string, cause error) (*Task, error) {
	svc, err := c.taskService()
	if err != nil {
		return nil, err
	}
	t, err := svc.FailTask(ctx, &flov1.FailTaskRequest{Namespace: c.namespace, Token: token, Error: wireText(errorText(cause)), ErrorCode: wireText(ErrorCode(cause))})
	if err != nil {
		return nil, fmt.Errorf("fail task by token: %w", err)
	}
	return taskFromProto(t), nil
}
