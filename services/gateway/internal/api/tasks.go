package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/gateway/internal/action"
	"github.com/razorbill/flo/services/gateway/internal/invoke"
	"github.com/razorbill/flo/services/gateway/internal/namespace"
	"github.com/razorbill/flo/services/gateway/internal/taskwait"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

const (
	// MaxDelay bounds an invocation's delay_ms: far enough for any schedule
	// a queue should hold, and far from where milliseconds overflow a
	// time.Duration (292 years) or a timestamp leaves year 9999.
	MaxDelay     = 365 * 24 * time.Hour
	maxDelayText = "365 days"
	// DefaultAwait is how long AwaitTask waits when the request names no timeout.
	DefaultAwait = 30 * time.Second
	// MaxAwait caps AwaitTask's timeout; longer requests wait this long.
	MaxAwait = 5 * time.Minute
)

// Invoker puts invocations on the log.
type Invoker interface {
	// InvokeMany queues every command and returns their task ids in order,
	// or an error when any of them could not be queued.
	InvokeMany(ctx context.Context, cmds []invoke.Command) (taskIDs []string, err error)
}

// TaskServer implements flov1.TaskServiceServer.
type TaskServer struct {
	flov1.UnimplementedTaskServiceServer

	dispatcher      dispatcherv1.DispatcherClient
	namespaces      *namespace.Cache
	actions         *action.Cache
	invoker         Invoker
	waiters         *taskwait.Registry
	followEvents    func(ctx context.Context) (stop func(), err error)
	maxPayloadBytes int
	maxBatchBytes   int
	log             *slog.Logger
}

// TaskServerDeps is what a TaskServer works with.
type TaskServerDeps struct {
	Dispatcher dispatcherv1.DispatcherClient
	Namespaces *namespace.Cache
	Actions    *action.Cache
	Invoker    Invoker
	Waiters    *taskwait.Registry
	// FollowEvents makes sure the task events that wake Waiters are read,
	// and returns once they are (kafka.Tail.Follow); stop says they are no
	// longer needed for this wait. Nil when they are always read.
	FollowEvents    func(ctx context.Context) (stop func(), err error)
	MaxPayloadBytes int
	// MaxBatchBytes bounds the payloads of one InvokeTasks call together;
	// zero means DefaultMaxBatchBytes. It is raised to MaxPayloadBytes if
	// lower, so that one item at the payload limit always fits.
	MaxBatchBytes int
	Log           *slog.Logger
}

// NewTaskServer returns a TaskServer.
func NewTaskServer(deps TaskServerDeps) *TaskServer {
	return &TaskServer{
		dispatcher:      deps.Dispatcher,
		namespaces:      deps.Namespaces,
		actions:         deps.Actions,
		invoker:         deps.Invoker,
		waiters:         deps.Waiters,
		followEvents:    deps.FollowEvents,
		maxPayloadBytes: deps.MaxPayloadBytes,
		maxBatchBytes:   max(cmp.Or(deps.MaxBatchBytes, DefaultMaxBatchBytes), deps.MaxPayloadBytes),
		log:             deps.Log,
	}
}

// Batch limits of InvokeTasks: items per call, and the default bound on the
// payload bytes of all items together (gRPC's usual 4 MiB message).
const (
	MaxInvokeBatch       = 1000
	DefaultMaxBatchBytes = 4 << 20
)

// InvokeTask validates an invocation and puts it on the log, answering with
// the task id once the broker holds the command. Nothing is written when any
// check fails.
func (s *TaskServer) InvokeTask(ctx context.Context, req *flov1.InvokeTaskRequest) (*flov1.InvokeTaskResponse, error) {
	cmd, err := s.parse(req.GetNamespace(), req)
	if err != nil {
		return nil, err
	}
	if err := CheckNamespace(ctx, s.log, s.namespaces, cmd.Namespace); err != nil {
		return nil, err
	}
	if err := s.checkAction(ctx, cmd); err != nil {
		return nil, err
	}
	ids, err := s.invoke(ctx, []invoke.Command{cmd})
	if err != nil {
		return nil, err
	}
	return &flov1.InvokeTaskResponse{TaskId: ids[0]}, nil
}

// InvokeTasks validates every invocation of the batch and puts them all on
// the log in one go, answering with the task ids in request order once the
// broker holds every command. Nothing is written when any item fails a
// check; an item's error names its index.
func (s *TaskServer) InvokeTasks(ctx context.Context, req *flov1.InvokeTasksRequest) (*flov1.InvokeTasksResponse, error) {
	items := req.GetTasks()
	switch {
	case len(items) == 0:
		return nil, status.Error(codes.InvalidArgument, "tasks must hold at least one invocation")
	case len(items) > MaxInvokeBatch:
		return nil, status.Errorf(codes.InvalidArgument, "tasks holds %d invocations, limit is %d", len(items), MaxInvokeBatch)
	}
	ns := req.GetNamespace()
	cmds := make([]invoke.Command, len(items))
	total := 0
	for i, item := range items {
		if item.GetNamespace() != "" && item.GetNamespace() != ns {
			return nil, status.Errorf(codes.InvalidArgument, "tasks[%d]: namespace %q differs from the request's %q", i, item.GetNamespace(), ns)
		}
		cmd, err := s.parse(ns, item)
		if err != nil {
			return nil, itemError(i, err)
		}
		if total += len(cmd.Payload); total > s.maxBatchBytes {
			return nil, status.Errorf(codes.InvalidArgument, "the payloads of tasks[0..%d] add up to more than the batch limit of %d bytes", i, s.maxBatchBytes)
		}
		cmds[i] = cmd
	}
	if err := CheckNamespace(ctx, s.log, s.namespaces, ns); err != nil {
		return nil, err
	}
	for i, cmd := range cmds {
		// The action cache answers repeats without a round trip.
		if err := s.checkAction(ctx, cmd); err != nil {
			return nil, itemError(i, err)
		}
	}
	ids, err := s.invoke(ctx, cmds)
	if err != nil {
		return nil, err
	}
	return &flov1.InvokeTasksResponse{TaskIds: ids}, nil
}

// parse checks what one invocation of namespace ns says on its own and
// returns its command; the namespace and action are checked separately.
func (s *TaskServer) parse(ns string, req *flov1.InvokeTaskRequest) (invoke.Command, error) {
	if err := text.Name("action", req.GetAction()); err != nil {
		return invoke.Command{}, Invalid(err)
	}
	if err := text.Key("idempotency_key", req.GetIdempotencyKey()); err != nil {
		return invoke.Command{}, Invalid(err)
	}
	if d := req.GetDelayMs(); d < 0 || d > MaxDelay.Milliseconds() {
		return invoke.Command{}, status.Errorf(codes.InvalidArgument, "delay_ms must be between 0 and %d (%s), got %d", MaxDelay.Milliseconds(), maxDelayText, d)
	}
	payload := req.GetPayload()
	if len(payload) == 0 && req.GetInput() != nil {
		var err error
		if payload, err = encodeJSON(req.GetInput()); err != nil {
			return invoke.Command{}, status.Errorf(codes.InvalidArgument, "encode input as JSON: %v", err)
		}
	}
	if len(payload) > s.maxPayloadBytes {
		return invoke.Command{}, status.Errorf(codes.InvalidArgument, "payload is %d bytes, limit is %d", len(payload), s.maxPayloadBytes)
	}
	if n := traceContextBytes(req.GetTraceContext()); n > MaxTraceContextBytes {
		return invoke.Command{}, status.Errorf(codes.InvalidArgument, "trace_context is %d bytes, limit is %d", n, MaxTraceContextBytes)
	}
	return invoke.Command{
		Namespace:      ns,
		Action:         req.GetAction(),
		Payload:        payload,
		IdempotencyKey: req.GetIdempotencyKey(),
		Priority:       req.GetPriority(),
		Delay:          time.Duration(req.GetDelayMs()) * time.Millisecond,
		TraceContext:   req.GetTraceContext(),
	}, nil
}

// MaxTraceContextBytes bounds an invocation's trace_context, keys and
// values together: what the W3C headers need many times over, and what
// gRPC allows a call's metadata in all (its default header list limit is
// 16 KiB).
const MaxTraceContextBytes = 8 << 10

func traceContextBytes(m map[string]string) int {
	n := 0
	for k, v := range m {
		n += len(k) + len(v)
	}
	return n
}

// checkAction checks that cmd's action exists and is enabled.
func (s *TaskServer) checkAction(ctx context.Context, cmd invoke.Command) error {
	err := s.actions.CheckInvocable(ctx, cmd.Namespace, cmd.Action)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, action.ErrNotFound):
		return status.Errorf(codes.NotFound, "action %q not found in namespace %q", cmd.Action, cmd.Namespace)
	case errors.Is(err, action.ErrDisabled):
		return status.Errorf(codes.FailedPrecondition, "action %q in namespace %q is disabled", cmd.Action, cmd.Namespace)
	default:
		return upstream(ctx, s.log, "check action", err)
	}
}

// itemError prefixes the message of a batch item's error with its index,
// keeping its code.
func itemError(i int, err error) error {
	st := status.Convert(err)
	return status.Errorf(st.Code(), "tasks[%d]: %s", i, st.Message())
}

// invoke puts validated commands on the log and returns their task ids.
func (s *TaskServer) invoke(ctx context.Context, cmds []invoke.Command) ([]string, error) {
	ids, err := s.invoker.InvokeMany(ctx, cmds)
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		s.log.ErrorContext(ctx, "invoke tasks failed", slog.String("namespace", cmds[0].Namespace),
			slog.Int("tasks", len(cmds)), slog.Any("error", err))
		if len(cmds) == 1 {
			return nil, status.Error(codes.Unavailable, "the task could not be queued; it was not created, retry later")
		}
		return nil, status.Error(codes.Unavailable, "the tasks could not all be queued; some may have been created, retry later (with idempotency keys to avoid duplicates)")
	}
	return ids, nil
}

// encodeJSON renders a JSON value the way a JSON client wrote it, without
// protojson's deliberately unstable spacing or HTML escaping.
func encodeJSON(v *structpb.Value) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v.AsInterface()); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// GetTask reads a task.
func (s *TaskServer) GetTask(ctx context.Context, req *flov1.GetTaskRequest) (*flov1.Task, error) {
	if err := s.checkTask(ctx, req.GetNamespace(), req.GetTaskId()); err != nil {
		return nil, err
	}
	t, err := s.dispatcher.GetTask(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "get task", err)
	}
	return t, nil
}

// AwaitTask returns the task once it is final or the timeout passed. It
// makes sure the task events are read and registers its waiter before
// reading the task, so an event finishing the task after that read always
// wakes it; an unknown task id is waited for too, since its invoke command
// may not have been applied yet.
func (s *TaskServer) AwaitTask(ctx context.Context, req *flov1.AwaitTaskRequest) (*flov1.Task, error) {
	if err := s.checkTask(ctx, req.GetNamespace(), req.GetTaskId()); err != nil {
		return nil, err
	}
	timeout, err := awaitTimeout(req.GetTimeoutMs())
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	if s.followEvents != nil {
		fctx, cancel := context.WithDeadline(ctx, deadline)
		stop, err := s.followEvents(fctx)
		cancel()
		switch {
		case err == nil:
			defer stop()
		case ctx.Err() != nil:
			return nil, status.FromContextError(ctx.Err()).Err()
		default:
			// Without the events (the broker is away) the wait still
			// ends at its timeout, with the task as it is then.
			s.log.WarnContext(ctx, "await task: task events cannot be read; waiting without them", "task_id", req.GetTaskId(), "error", err)
		}
	}
	get := &flov1.GetTaskRequest{Namespace: req.GetNamespace(), TaskId: req.GetTaskId()}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		done, release, err := s.waiters.Register(req.GetTaskId())
		switch {
		case errors.Is(err, taskwait.ErrClosed):
			return s.GetTask(ctx, get)
		case err != nil:
			return nil, status.Errorf(codes.ResourceExhausted, "await task: %v", err)
		}
		t, err := s.dispatcher.GetTask(ctx, get)
		switch {
		case err == nil && taskwait.Final(t.GetStatus()):
			release()
			return t, nil
		case err != nil && status.Code(err) != codes.NotFound:
			release()
			return nil, upstream(ctx, s.log, "get task", err)
		}
		select {
		case <-done:
			release()
		case <-timer.C:
			release()
			return s.GetTask(ctx, get)
		case <-ctx.Done():
			release()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

func awaitTimeout(ms int64) (time.Duration, error) {
	switch {
	case ms < 0:
		return 0, status.Errorf(codes.InvalidArgument, "timeout_ms must not be negative, got %d", ms)
	case ms == 0:
		return DefaultAwait, nil
	case ms > MaxAwait.Milliseconds():
		return MaxAwait, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// ListDeadLetters lists a namespace's dead-lettered tasks.
func (s *TaskServer) ListDeadLetters(ctx context.Context, req *flov1.ListDeadLettersRequest) (*flov1.ListDeadLettersResponse, error) {
	if err := CheckNamespace(ctx, s.log, s.namespaces, req.GetNamespace()); err != nil {
		return nil, err
	}
	resp, err := s.dispatcher.ListDeadLetters(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "list dead letters", err)
	}
	return resp, nil
}

// RequeueDeadLetter puts a dead-lettered task back in its queue.
func (s *TaskServer) RequeueDeadLetter(ctx context.Context, req *flov1.GetTaskRequest) (*flov1.Task, error) {
	if err := s.checkTask(ctx, req.GetNamespace(), req.GetTaskId()); err != nil {
		return nil, err
	}
	t, err := s.dispatcher.RequeueDeadLetter(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "requeue dead letter", err)
	}
	return t, nil
}

// maxTokenBytes bounds a completion token; real ones are far shorter.
const maxTokenBytes = 256

// CompleteTask finishes a task waiting for its result successfully, by the
// completion token its handler got.
func (s *TaskServer) CompleteTask(ctx context.Context, req *flov1.CompleteTaskRequest) (*flov1.Task, error) {
	if err := s.checkToken(ctx, req.GetNamespace(), req.GetToken()); err != nil {
		return nil, err
	}
	result := req.GetResult()
	if len(result) == 0 && req.GetOutput() != nil {
		var err error
		if result, err = encodeJSON(req.GetOutput()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "encode output as JSON: %v", err)
		}
	}
	if len(result) > s.maxPayloadBytes {
		return nil, status.Errorf(codes.InvalidArgument, "result is %d bytes, limit is %d", len(result), s.maxPayloadBytes)
	}
	t, err := s.dispatcher.CompleteTask(ctx, &flov1.CompleteTaskRequest{
		Namespace: req.GetNamespace(), Token: req.GetToken(), Result: result, Outcome: req.GetOutcome(),
	})
	if err != nil {
		return nil, upstream(ctx, s.log, "complete task", err)
	}
	return t, nil
}

// FailTask finishes a task waiting for its result with a final failure, by
// the completion token its handler got.
func (s *TaskServer) FailTask(ctx context.Context, req *flov1.FailTaskRequest) (*flov1.Task, error) {
	if err := s.checkToken(ctx, req.GetNamespace(), req.GetToken()); err != nil {
		return nil, err
	}
	t, err := s.dispatcher.FailTask(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "fail task", err)
	}
	return t, nil
}

func (s *TaskServer) checkToken(ctx context.Context, ns, token string) error {
	if token == "" || len(token) > maxTokenBytes {
		return status.Errorf(codes.InvalidArgument, "token must be a completion token of 1 to %d bytes", maxTokenBytes)
	}
	return CheckNamespace(ctx, s.log, s.namespaces, ns)
}

func (s *TaskServer) checkTask(ctx context.Context, ns, taskID string) error {
	if err := checkTaskID(taskID); err != nil {
		return err
	}
	return CheckNamespace(ctx, s.log, s.namespaces, ns)
}
