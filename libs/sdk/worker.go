package flo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// DefaultActionTimeout is the default of [ActionWorkerOptions.ActionTimeout].
const DefaultActionTimeout = 5 * time.Minute

// maxBatchBytes keeps a ResultBatch well under gRPC's default 4 MiB message limit even when
// handlers return large bodies; a larger single result goes alone.
const maxBatchBytes = 2 << 20

// resultDelay is how long results may wait while other handlers still run, so that tasks
// finishing about together are reported in one message, and recorded by the dispatcher in
// fewer transactions, instead of one each. A worker whose handlers are all done reports at
// once, so a lone task's result is not delayed.
const resultDelay = 2 * time.Millisecond

// ActionWorkerOptions configure an [ActionWorker]. Zero fields take the defaults.
type ActionWorkerOptions struct {
	// WorkerID identifies the worker to the server; the default is the host name and eight
	// random hex digits, so restarts and replicas never collide.
	WorkerID string
	// MachineID groups workers running on one host; the default is the host name.
	MachineID string
	// Concurrency is how many tasks run at once (default 10).
	Concurrency int
	// ActionTimeout bounds one handler execution: the handler's context ends then, and a
	// stopping worker waits no longer than this for its handlers (default 5 minutes).
	ActionTimeout time.Duration
	// BlockMS is how long the server may hold a request for tasks open before answering that
	// there are none (default 300000, five minutes).
	BlockMS int64
	// LeaseMS is how long a claimed task stays this worker's before the server may hand it to
	// another; zero means the action's timeout.
	LeaseMS int64
	// HeartbeatInterval is how often the worker tells the registry it is alive and how many
	// tasks it is running (default 30 s). The registry marks a worker silent for 90 s unhealthy.
	HeartbeatInterval time.Duration
	// Metadata is recorded with the worker in the registry as a JSON object: labels, version,
	// environment. It must encode as JSON.
	Metadata map[string]any
	// Logger receives connection changes and handler panics; the default is slog.Default().
	Logger *slog.Logger
}

// ActionWorker runs action handlers for tasks it receives over one worker stream. Register
// handlers, then call Start.
type ActionWorker struct {
	lifecycle
	opts ActionWorkerOptions

	// handlers is guarded by lifecycle.mu; actions, their sorted names, is set as Start
	// begins, after which handlers no longer change.
	handlers map[string]handlerFunc
	actions  []string

	touchMu sync.Mutex
	touches map[string]chan *flov1.TouchAck
}

// NewActionWorker returns a worker that takes tasks through this client's connection and
// namespace. Call it after [Client.Connect].
func (c *Client) NewActionWorker(opts ActionWorkerOptions) (*ActionWorker, error) {
	if opts.Concurrency < 0 || opts.ActionTimeout < 0 || opts.BlockMS < 0 || opts.LeaseMS < 0 || opts.HeartbeatInterval < 0 {
		return nil, errors.New("flo: worker options must not be negative")
	}
	opts.WorkerID, opts.MachineID = workerIdentity(opts.WorkerID, opts.MachineID)
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.ActionTimeout == 0 {
		opts.ActionTimeout = DefaultActionTimeout
	}
	if opts.BlockMS == 0 {
		opts.BlockMS = DefaultBlockMS
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	w := &ActionWorker{
		opts:     opts,
		handlers: map[string]handlerFunc{},
		touches:  map[string]chan *flov1.TouchAck{},
	}
	err := w.setup(c, w, workerSettings{
		workerID:          opts.WorkerID,
		machineID:         opts.MachineID,
		concurrency:       opts.Concurrency,
		heartbeatInterval: opts.HeartbeatInterval,
		handlerTimeout:    opts.ActionTimeout,
		reportDelay:       resultDelay,
		metadata:          opts.Metadata,
		logger:            opts.Logger,
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Options returns the worker's options with defaults filled in.
func (w *ActionWorker) Options() ActionWorkerOptions { return w.opts }

// ID returns the worker's id, the one it registers and is listed, drained and deregistered
// under.
func (w *ActionWorker) ID() string { return w.opts.WorkerID }

// RegisterAction sets the handler for action. The handler is a
// func(*ActionContext) ([]byte, error), whose bytes become the result as they are, or a
// func(*ActionContext) (interface{}, error), whose value is encoded as JSON (a []byte value is
// kept as it is, and [ActionContext.Result] sets a named outcome). The server creates actions
// it does not know yet with default settings when the worker connects; register them with
// [Client.RegisterAction] to choose timeouts and retries. Handlers must be registered before
// Start.
func (w *ActionWorker) RegisterAction(action string, handler any) error {
	if action == "" {
		return errors.New("flo: register action: empty action name")
	}
	h, err := adaptHandler(action, handler)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started || w.closed {
		return fmt.Errorf("register action %s: %w", action, ErrWorkerClosed)
	}
	if _, dup := w.handlers[action]; dup {
		return fmt.Errorf("flo: register action %s: handler already registered", action)
	}
	w.handlers[action] = h
	return nil
}

// MustRegisterAction is RegisterAction that panics on error, for registration at start-up
// where a wrong handler is a programming mistake.
func (w *ActionWorker) MustRegisterAction(action string, handler any) {
	if err := w.RegisterAction(action, handler); err != nil {
		panic(err)
	}
}

// Start registers the worker in the worker registry, connects to the server and runs tasks
// until ctx ends, Close is called or the worker is drained (from the CLI, the API, or by the
// registry's answer to a heartbeat). It then stops asking for tasks, lets the running handlers
// finish (waiting at most ActionTimeout), reports their results, closes the stream, removes the
// worker from the registry and returns nil. While it runs it sends the registry a heartbeat
// with its load every HeartbeatInterval, registering again if the registry lost its record.
// A broken stream is reopened with backoff while handlers keep running; their results go out on
// the new stream. The registry is not on the task path: while it is unreachable the worker runs
// and keeps trying. Start returns an error only when it cannot run at all: no handlers, a
// closed worker or client, a registration the registry refuses (bad metadata, too many
// workers), or a server that refuses the worker (bad token, unknown namespace).
func (w *ActionWorker) Start(ctx context.Context) error { return w.run(ctx) }

// Close stops a running worker the way the end of Start's context does and waits for Start to
// return, which removes the worker from the registry. Closing a worker that never started, or
// closing twice, does nothing more.
func (w *ActionWorker) Close() error { return w.close() }

// check refuses to start without handlers and fixes the action list for the worker's life.
func (w *ActionWorker) check() error {
	if len(w.handlers) == 0 {
		return errors.New("flo: start worker: no actions registered")
	}
	w.actions = make([]string, 0, len(w.handlers))
	for name := range w.handlers {
		w.actions = append(w.actions, name)
	}
	// Sorted so Hello, Ready and the registration are stable.
	slices.Sort(w.actions)
	return nil
}

func (w *ActionWorker) registration() (flov1.WorkerType, []*flov1.WorkerProcess) {
	processes := make([]*flov1.WorkerProcess, len(w.actions))
	for i, name := range w.actions {
		processes[i] = &flov1.WorkerProcess{Name: name, Kind: flov1.ProcessKind_PROCESS_KIND_ACTION}
	}
	return flov1.WorkerType_WORKER_TYPE_ACTION, processes
}

// prepare has nothing to do: the gateway creates unknown actions from the Hello.
func (w *ActionWorker) prepare(context.Context) error { return nil }

func (w *ActionWorker) hello(h *flov1.Hello) { h.Actions = w.actions }

// receive handles tasks, which it starts as slots allow, touch answers and refused results.
func (w *ActionWorker) receive(ctx context.Context, msg *flov1.ServerMessage) error {
	switch m := msg.GetMsg().(type) {
	case *flov1.ServerMessage_TaskBatch:
		tasks := m.TaskBatch.GetTasks()
		if len(tasks) == 0 {
			// The oldest Ready expired with credit left: the writer asks for it again.
			w.slots.expire()
			poke(w.wake)
			return nil
		}
		for _, task := range tasks {
			if err := w.startTask(ctx, task); err != nil {
				return err
			}
		}
	case *flov1.ServerMessage_TouchAck:
		w.deliverTouchAck(m.TouchAck)
	case *flov1.ServerMessage_ResultAck:
		if ids := m.ResultAck.GetRejectedTaskIds(); len(ids) > 0 {
			w.log.Warn("flo: server refused results", "task_ids", ids, "error", m.ResultAck.GetError())
		}
	}
	return nil
}

// startTask takes a slot for task and runs it. A stopping worker hands new tasks straight
// back.
func (w *ActionWorker) startTask(ctx context.Context, task *flov1.TaskAssignment) error {
	ok, err := w.takeSlot(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return w.enqueue(ctx, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Abandon{Abandon: &flov1.Abandon{
			TaskId: task.GetTaskId(), Attempt: task.GetAttempt(),
		}}})
	}
	h, found := w.handler(task.GetAction())
	if !found {
		h = func(*ActionContext) (string, []byte, error) {
			return "", nil, fmt.Errorf("worker %s has no handler for action %s", w.opts.WorkerID, task.GetAction())
		}
	}
	w.dispatch(func() *flov1.WorkerMessage { return w.execute(task, h) })
	return nil
}

func (w *ActionWorker) handler(action string) (handlerFunc, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.handlers[action]
	return h, ok
}

// pack sends Nack, Abandon and Touch one by one and all results as few ResultBatch messages as
// the size limit allows.
func (w *ActionWorker) pack(queued []*flov1.WorkerMessage) []*flov1.WorkerMessage {
	var batch []*flov1.Result
	msgs := make([]*flov1.WorkerMessage, 0, len(queued))
	for _, msg := range queued {
		switch m := msg.GetMsg().(type) {
		case *flov1.WorkerMessage_Result:
			batch = append(batch, m.Result)
		case *flov1.WorkerMessage_ResultBatch:
			// A batch a broken stream did not take, queued again.
			batch = append(batch, m.ResultBatch.GetResults()...)
		default:
			msgs = append(msgs, msg)
		}
	}
	for len(batch) > 0 {
		n, size := 0, 0
		for n < len(batch) {
			item := batch[n].SizeVT()
			if n > 0 && size+item > maxBatchBytes {
				break
			}
			size += item
			n++
		}
		msgs = append(msgs, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_ResultBatch{ResultBatch: &flov1.ResultBatch{Results: batch[:n]}}})
		batch = batch[n:]
	}
	return msgs
}

// request asks for a task for every slot that is neither running one nor already promised
// one.
func (w *ActionWorker) request() *flov1.WorkerMessage {
	credit := w.slots.grant()
	if credit == 0 {
		return nil
	}
	return &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Ready{Ready: &flov1.Ready{
		Actions: w.actions,
		Count:   int32(credit),
		BlockMs: w.opts.BlockMS,
		LeaseMs: w.opts.LeaseMS,
	}}}
}

// streamEnded answers the touches still waiting: their answers would never come.
func (w *ActionWorker) streamEnded() { w.failTouches("worker stream closed") }

// touch sends a lease extension for task and waits for the server's answer.
func (w *ActionWorker) touch(ctx context.Context, task *flov1.TaskAssignment, extendMS int64) error {
	id := task.GetTaskId()
	ack := make(chan *flov1.TouchAck, 1)
	w.touchMu.Lock()
	if _, busy := w.touches[id]; busy {
		w.touchMu.Unlock()
		return fmt.Errorf("touch task %s: another touch is waiting for its answer", id)
	}
	w.touches[id] = ack
	w.touchMu.Unlock()
	defer func() {
		w.touchMu.Lock()
		delete(w.touches, id)
		w.touchMu.Unlock()
	}()

	msg := &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Touch{Touch: &flov1.Touch{
		TaskId: id, Attempt: task.GetAttempt(), ExtendMs: extendMS,
	}}}
	if err := w.enqueue(ctx, msg); err != nil {
		return fmt.Errorf("touch task %s: %w", id, err)
	}
	select {
	case a := <-ack:
		if !a.GetOk() {
			return fmt.Errorf("touch task %s: %s", id, a.GetError())
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("touch task %s: %w", id, ctx.Err())
	case <-w.quit:
		return fmt.Errorf("touch task %s: %w", id, ErrWorkerClosed)
	}
}

func (w *ActionWorker) deliverTouchAck(a *flov1.TouchAck) {
	w.touchMu.Lock()
	defer w.touchMu.Unlock()
	if c, ok := w.touches[a.GetTaskId()]; ok {
		select {
		case c <- a:
		default:
		}
	}
}

// failTouches answers every waiting touch with an error when its stream is gone: the answer
// would never come, and the handler is better off knowing now.
func (w *ActionWorker) failTouches(reason string) {
	w.touchMu.Lock()
	defer w.touchMu.Unlock()
	for id, c := range w.touches {
		select {
		case c <- &flov1.TouchAck{TaskId: id, Ok: false, Error: reason}:
		default:
		}
	}
}
