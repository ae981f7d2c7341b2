package flo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults of [ActionWorkerOptions].
const (
	DefaultConcurrency       = 10
	DefaultActionTimeout     = 5 * time.Minute
	DefaultBlockMS           = 30_000
	DefaultHeartbeatInterval = 30 * time.Second
)

const (
	// outboundBuffer bounds the messages waiting for the stream's writer; a handler finishing
	// while it is full waits, which is the back-pressure a slow stream needs.
	outboundBuffer = 256
	// reconnectMin and reconnectMax bound the wait between attempts to reopen the stream.
	reconnectMin = 100 * time.Millisecond
	reconnectMax = 5 * time.Second
	// helloTimeout bounds the wait for the server's answer to a hello; the gateway may spend
	// up to 30 s registering the worker's actions while the dispatcher restarts.
	helloTimeout = 45 * time.Second
	// drainGrace is added to ActionTimeout when a stopping worker waits for its handlers:
	// their contexts end at ActionTimeout, and this leaves time to report what they returned.
	drainGrace = 5 * time.Second
	// closeTimeout bounds the wait for the server to end the stream after the worker closed
	// its side.
	closeTimeout = 5 * time.Second
)

// ErrWorkerClosed is returned by Start and RegisterAction on a worker that was closed or has
// already run.
var ErrWorkerClosed = errors.New("flo: worker closed")

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
	// there are none (default 30000).
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
	client *Client
	opts   ActionWorkerOptions
	log    *slog.Logger
	// metadata is opts.Metadata encoded once, as the registry takes it.
	metadata string

	mu       sync.Mutex
	handlers map[string]handlerFunc
	started  bool
	closed   bool
	// base gives handlers the values of Start's context without its cancellation.
	base   context.Context
	cancel context.CancelFunc
	done   chan struct{}

	// out carries every message for the server except Ready, which the writer derives from
	// slots; it outlives streams so results survive a reconnect.
	out chan *flov1.WorkerMessage
	// unsent holds messages taken from out that no stream has accepted yet; only the writer of
	// the current stream touches it.
	unsent []*flov1.WorkerMessage
	// wake tells the writer a slot was freed or credit came back.
	wake chan struct{}
	// slotFreed tells the reader, waiting for a slot, that one was freed.
	slotFreed chan struct{}
	slots     slots

	stopping      atomic.Bool
	stopOnce      sync.Once
	stopCh        chan struct{}
	drainDeadline time.Time
	// registered says the worker may have a record in the registry that it must remove when it
	// stops; it is set before the first registration is sent, since one that seemed to fail
	// may still have been stored.
	registered atomic.Bool
	// quit is closed when Start returns, releasing handlers that still wait to report.
	quit chan struct{}

	touchMu sync.Mutex
	touches map[string]chan *flov1.TouchAck
}

// NewActionWorker returns a worker that takes tasks through this client's connection and
// namespace. Call it after [Client.Connect].
func (c *Client) NewActionWorker(opts ActionWorkerOptions) (*ActionWorker, error) {
	if opts.Concurrency < 0 || opts.ActionTimeout < 0 || opts.BlockMS < 0 || opts.LeaseMS < 0 || opts.HeartbeatInterval < 0 {
		return nil, errors.New("flo: worker options must not be negative")
	}
	var metadata string
	if len(opts.Metadata) > 0 {
		b, err := json.Marshal(opts.Metadata)
		if err != nil {
			return nil, fmt.Errorf("flo: worker metadata: %w", err)
		}
		metadata = string(b)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	if opts.WorkerID == "" {
		var suffix [4]byte
		_, _ = rand.Read(suffix[:]) // crypto/rand.Read never fails
		opts.WorkerID = host + "-" + hex.EncodeToString(suffix[:])
	}
	if opts.MachineID == "" {
		opts.MachineID = host
	}
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
	return &ActionWorker{
		client:    c,
		opts:      opts,
		log:       opts.Logger.With("worker_id", opts.WorkerID, "namespace", c.namespace),
		metadata:  metadata,
		handlers:  map[string]handlerFunc{},
		out:       make(chan *flov1.WorkerMessage, outboundBuffer),
		wake:      make(chan struct{}, 1),
		slotFreed: make(chan struct{}, 1),
		slots:     slots{size: opts.Concurrency},
		stopCh:    make(chan struct{}),
		quit:      make(chan struct{}),
		touches:   map[string]chan *flov1.TouchAck{},
	}, nil
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
func (w *ActionWorker) Start(ctx context.Context) error {
	w.mu.Lock()
	if w.started || w.closed {
		w.mu.Unlock()
		return ErrWorkerClosed
	}
	if len(w.handlers) == 0 {
		w.mu.Unlock()
		return errors.New("flo: start worker: no actions registered")
	}
	if _, err := w.client.workerService(); err != nil {
		w.mu.Unlock()
		return fmt.Errorf("start worker: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	w.started, w.cancel, w.done = true, cancel, make(chan struct{})
	w.base = context.WithoutCancel(ctx)
	w.mu.Unlock()

	defer close(w.done)
	defer close(w.quit)
	defer cancel()
	go func() {
		<-runCtx.Done()
		w.stop()
	}()

	beats, stopBeats := context.WithCancel(w.base)
	var beating sync.WaitGroup
	defer func() {
		stopBeats()
		beating.Wait()
		w.deregister()
	}()
	if err := w.register(runCtx); err != nil {
		switch {
		case runCtx.Err() != nil:
			return nil
		case registryUnreachable(err):
			w.log.Warn("flo: worker registry unreachable; running and registering again once it answers", "error", err)
		default:
			return fmt.Errorf("flo: worker %s: %w", w.opts.WorkerID, err)
		}
	}
	beating.Go(func() { w.heartbeatLoop(beats) })

	delay := reconnectMin
	for {
		if w.stopping.Load() && w.nothingToReport() {
			return nil
		}
		connected, err := w.session(runCtx)
		if err == nil {
			return nil
		}
		if w.stopping.Load() {
			if w.nothingToReport() || time.Now().After(w.drainDeadline) {
				return nil
			}
		} else if fatal(err) {
			return fmt.Errorf("flo: worker %s: %w", w.opts.WorkerID, err)
		}
		if connected {
			delay = reconnectMin
		}
		w.log.Warn("flo: worker stream down; reconnecting", "error", err, "retry_in", delay)
		if !w.sleep(delay) {
			return nil
		}
		delay = min(delay*2, reconnectMax)
	}
}

// Close stops a running worker the way the end of Start's context does and waits for Start to
// return, which removes the worker from the registry. Closing a worker that never started, or
// closing twice, does nothing more.
func (w *ActionWorker) Close() error {
	w.mu.Lock()
	w.closed = true
	cancel, done := w.cancel, w.done
	w.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return nil
}

// stop switches the worker to draining, once, whatever asked first: the end of Start's
// context, Close, a Drain message or a heartbeat answered "draining".
func (w *ActionWorker) stop() { w.stopOnce.Do(w.beginStop) }

// drain stops the worker at once, before the writer can send another Ready, and ends Start's
// run context.
func (w *ActionWorker) drain(reason string) {
	if !w.stopping.Load() {
		w.log.Info("flo: worker draining: finishing running tasks, taking no new ones", "reason", reason)
	}
	w.stop()
	w.mu.Lock()
	cancel := w.cancel
	w.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// beginStop switches the worker to draining: no more Ready, newly arriving tasks abandoned.
func (w *ActionWorker) beginStop() {
	w.drainDeadline = time.Now().Add(w.opts.ActionTimeout + drainGrace)
	w.stopping.Store(true)
	close(w.stopCh)
	poke(w.wake)
	poke(w.slotFreed)
}

// sleep waits d before the next reconnect. While stopping it gives up at the drain deadline
// and reports false.
func (w *ActionWorker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.stopCh:
	}
	if w.nothingToReport() {
		return false
	}
	remaining := time.Until(w.drainDeadline)
	if remaining <= 0 {
		return false
	}
	select {
	case <-t.C:
		return true
	case <-time.After(remaining):
		return false
	}
}

// nothingToReport says whether a stopping worker is done: no handler running and no message
// waiting to be sent. inFlight is read first: a handler queues its report before freeing its
// slot, so once the count is zero every report is already in out.
func (w *ActionWorker) nothingToReport() bool {
	return w.slots.running() == 0 && len(w.out) == 0 && len(w.unsent) == 0
}

// fatal reports whether the server refused the worker for a reason reconnecting cannot fix.
func fatal(err error) bool {
	if errors.Is(err, ErrNotConnected) {
		return true
	}
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.Unimplemented:
		return true
	}
	return false
}

// actionNames returns the registered actions, sorted so Hello and Ready are stable.
func (w *ActionWorker) actionNames() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	names := make([]string, 0, len(w.handlers))
	for name := range w.handlers {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

func (w *ActionWorker) handler(action string) (handlerFunc, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.handlers[action]
	return h, ok
}

// poke signals c without blocking; one pending signal is enough for its reader.
func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
