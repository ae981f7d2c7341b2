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
	"sync"
	"sync/atomic"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults shared by [ActionWorkerOptions] and [StreamWorkerOptions].
const (
	DefaultConcurrency = 10
	// DefaultBlockMS is the gateway's longest hold: a worker with nothing to
	// do renews its request once in five minutes, not every 30 seconds,
	// which with thousands of idle workers was most of their traffic.
	DefaultBlockMS           = 300_000
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
	// drainGrace is added to the handler timeout when a stopping worker waits for its
	// handlers: their contexts end at the timeout, and this leaves time to report what they
	// returned.
	drainGrace = 5 * time.Second
	// closeTimeout bounds the wait for the server to end the stream after the worker closed
	// its side.
	closeTimeout = 5 * time.Second
	// handlerIdle is how long a handler goroutine waits for its next task or record before it
	// ends.
	handlerIdle = 10 * time.Second
	// warnEvery is how many failed attempts in a row, to register or to reopen the stream,
	// make one Warn line (the others are Debug): a storm's retry or two stays quiet, a server
	// that stays away does not, and thousands of workers do not log a line per attempt.
	warnEvery = 4
)

// ErrWorkerClosed is returned by Start and RegisterAction on a worker that was closed or has
// already run.
var ErrWorkerClosed = errors.New("flo: worker closed")

// workerKind is what an action worker and a stream worker each add to the lifecycle they
// share: registration, heartbeats, the worker stream and its reconnects, drain and
// deregistration are the same for both; what a worker registers as, says in its hello, asks
// for, receives and reports is not.
type workerKind interface {
	// check says why the worker cannot start, if it cannot. It runs with the lifecycle's mu
	// held, once, as Start begins.
	check() error
	// registration returns what the worker registers as in the worker registry.
	registration() (flov1.WorkerType, []*flov1.WorkerProcess)
	// prepare runs before a stream is opened until it has succeeded once: the setup on the
	// server that the worker needs and that the registry does not do.
	prepare(ctx context.Context) error
	// hello fills in the kind's part of the stream's Hello.
	hello(*flov1.Hello)
	// receive handles a server message other than HelloAck and Drain. An error ends the stream.
	receive(ctx context.Context, msg *flov1.ServerMessage) error
	// pack turns the queued reports into the messages that carry them, coalescing what can go
	// in one message. It must not keep or return queued's backing array.
	pack(queued []*flov1.WorkerMessage) []*flov1.WorkerMessage
	// request returns the message asking for more work that the free slots allow, or nil.
	request() *flov1.WorkerMessage
	// streamEnded runs when a stream is gone, for what waited for its answers.
	streamEnded()
}

// workerSettings are the options every kind of worker has, defaults filled in.
type workerSettings struct {
	workerID          string
	machineID         string
	concurrency       int
	heartbeatInterval time.Duration
	// handlerTimeout bounds one handler execution; a stopping worker waits that long (and
	// drainGrace) for its handlers.
	handlerTimeout time.Duration
	// reportDelay is how long the writer may hold reports back while handlers still run, so
	// that more of them go out in one message; zero sends each as soon as it is queued.
	reportDelay time.Duration
	metadata    map[string]any
	logger      *slog.Logger
}

// workerIdentity returns the worker and machine ids, making up the ones not given: the host
// name and eight random hex digits, so restarts and replicas never collide, and the host name.
func workerIdentity(workerID, machineID string) (string, string) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	if workerID == "" {
		var suffix [4]byte
		_, _ = rand.Read(suffix[:]) // crypto/rand.Read never fails
		workerID = host + "-" + hex.EncodeToString(suffix[:])
	}
	if machineID == "" {
		machineID = host
	}
	return workerID, machineID
}

// lifecycle is the part of a worker that every kind shares: registration in the worker
// registry, heartbeats, one worker stream reopened with backoff while handlers keep running,
// drain, and deregistration. ActionWorker and StreamWorker embed it and supply a workerKind.
type lifecycle struct {
	client *Client
	kind   workerKind
	set    workerSettings
	log    *slog.Logger
	// metadata is set.metadata encoded once, as the registry takes it.
	metadata string

	mu      sync.Mutex
	started bool
	closed  bool
	// base gives handlers the values of Start's context without its cancellation.
	base context.Context
	// lastParent is the trace context last extracted from a task or record. The tasks of
	// one InvokeMany, and the records of one append, carry the same one, so most reuse it
	// instead of parsing it again.
	lastParent atomic.Pointer[parentTrace]
	cancel     context.CancelFunc
	done       chan struct{}
	// prepared says kind.prepare succeeded; only Start's goroutine touches it.
	prepared bool

	// out carries every report for the server; the request for more work the writer derives
	// from slots. It outlives streams so reports survive a reconnect.
	out chan *flov1.WorkerMessage
	// unsent holds messages taken from out that no stream has accepted yet; only the writer of
	// the current stream touches it.
	unsent []*flov1.WorkerMessage
	// wake tells the writer a slot was freed or credit came back.
	wake chan struct{}
	// slotFreed tells the reader, waiting for a slot, that one was freed.
	slotFreed chan struct{}
	slots     slots
	// handle passes work to an idle handler goroutine (see dispatch).
	handle chan func() *flov1.WorkerMessage

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
	// beats is the current stream's line for heartbeats, nil while no stream takes them.
	beats atomic.Pointer[beatLine]
	// beatFailures counts the heartbeats in a row that failed; only the heartbeat loop touches
	// it.
	beatFailures int
}

// setup prepares the lifecycle of a worker of kind; logAttrs go on every log line.
func (l *lifecycle) setup(c *Client, kind workerKind, set workerSettings, logAttrs ...any) error {
	if len(set.metadata) > 0 {
		b, err := json.Marshal(set.metadata)
		if err != nil {
			return fmt.Errorf("flo: worker metadata: %w", err)
		}
		l.metadata = string(b)
	}
	l.client, l.kind, l.set = c, kind, set
	l.log = set.logger.With(append([]any{"worker_id", set.workerID, "namespace", c.namespace}, logAttrs...)...)
	l.out = make(chan *flov1.WorkerMessage, outboundBuffer)
	l.wake = make(chan struct{}, 1)
	l.slotFreed = make(chan struct{}, 1)
	l.handle = make(chan func() *flov1.WorkerMessage)
	l.slots = slots{size: set.concurrency}
	l.stopCh = make(chan struct{})
	l.quit = make(chan struct{})
	return nil
}

// run is Start for every kind of worker: see [ActionWorker.Start].
func (l *lifecycle) run(ctx context.Context) error {
	l.mu.Lock()
	if l.started || l.closed {
		l.mu.Unlock()
		return ErrWorkerClosed
	}
	if err := l.kind.check(); err != nil {
		l.mu.Unlock()
		return err
	}
	if _, err := l.client.workerService(); err != nil {
		l.mu.Unlock()
		return fmt.Errorf("start worker: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	l.started, l.cancel, l.done = true, cancel, make(chan struct{})
	l.base = context.WithoutCancel(ctx)
	l.mu.Unlock()

	defer close(l.done)
	defer close(l.quit)
	defer cancel()
	go func() {
		<-runCtx.Done()
		l.stop()
	}()

	beats, stopBeats := context.WithCancel(l.base)
	var beating sync.WaitGroup
	defer func() {
		stopBeats()
		beating.Wait()
		l.deregister()
	}()
	retryAfter, err := l.register(runCtx)
	switch {
	case err == nil:
		beating.Go(func() { l.heartbeatLoop(beats) })
	case runCtx.Err() != nil:
		return nil
	case registrationTransient(err, retryAfter):
		// The worker starts working while it keeps trying to register.
		beating.Go(func() {
			l.keepRegistering(beats, err, retryAfter)
			l.heartbeatLoop(beats)
		})
	default:
		return fmt.Errorf("flo: worker %s: %w", l.set.workerID, err)
	}

	delays := newBackoff(reconnectMin, reconnectMax)
	// failed counts the attempts in a row that ended without a stream: the break is logged at
	// Warn, and then one attempt in warnEvery.
	failed := 0
	for {
		if l.stopping.Load() && l.nothingToReport() {
			return nil
		}
		connected, err := l.session(runCtx)
		if err == nil {
			return nil
		}
		if l.stopping.Load() {
			if l.nothingToReport() || time.Now().After(l.drainDeadline) {
				return nil
			}
		} else if fatal(err) {
			return fmt.Errorf("flo: worker %s: %w", l.set.workerID, err)
		}
		if connected {
			delays.Reset()
			failed = 0
		}
		failed++
		delay := delays.NextBackOff()
		level := slog.LevelDebug
		if failed == 1 || failed%warnEvery == 0 {
			level = slog.LevelWarn
		}
		l.log.Log(runCtx, level, "flo: worker stream down; reconnecting", "error", err, "retry_in", delay, "attempts", failed)
		if !l.sleep(delay) {
			return nil
		}
	}
}

// close is Close for every kind of worker: it stops a running worker the way the end of
// Start's context does and waits for Start to return.
func (l *lifecycle) close() error {
	l.mu.Lock()
	l.closed = true
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return nil
}

// stop switches the worker to draining, once, whatever asked first: the end of Start's
// context, Close, a Drain message or a heartbeat answered "draining".
func (l *lifecycle) stop() { l.stopOnce.Do(l.beginStop) }

// drain stops the worker at once, before the writer can ask for more work, and ends Start's
// run context.
func (l *lifecycle) drain(reason string) {
	if !l.stopping.Load() {
		l.log.Info("flo: worker draining: finishing what it holds, taking nothing new", "reason", reason)
	}
	l.stop()
	l.mu.Lock()
	cancel := l.cancel
	l.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// beginStop switches the worker to draining: no more requests for work, and work that still
// arrives handed back.
func (l *lifecycle) beginStop() {
	l.drainDeadline = time.Now().Add(l.set.handlerTimeout + drainGrace)
	l.stopping.Store(true)
	close(l.stopCh)
	poke(l.wake)
	poke(l.slotFreed)
}

// sleep waits d before the next reconnect. While stopping it gives up at the drain deadline
// and reports false.
func (l *lifecycle) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.stopCh:
	}
	if l.nothingToReport() {
		return false
	}
	remaining := time.Until(l.drainDeadline)
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
// waiting to be sent. The running count is read first: a handler queues its report before
// freeing its slot, so once the count is zero every report is already in out.
func (l *lifecycle) nothingToReport() bool {
	return l.slots.running() == 0 && len(l.out) == 0 && len(l.unsent) == 0
}

// takeSlot waits for a free handler slot for work that arrived and reports whether it got
// one; false means the worker is stopping and the work must be handed back. Waiting stops the
// reader, so a server sending more than was asked for meets back-pressure, not a queue.
func (l *lifecycle) takeSlot(ctx context.Context) (bool, error) {
	for {
		if l.stopping.Load() {
			l.slots.consume()
			return false, nil
		}
		if l.slots.acquire() {
			return true, nil
		}
		select {
		case <-l.slotFreed:
		case <-l.stopCh:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// dispatch runs a handler on a slot takeSlot took, in a goroutine of its own: an idle one if
// there is one, else a new one. A busy worker so reuses its goroutines, and the stacks they
// grew, instead of starting one for every task or record.
func (l *lifecycle) dispatch(handle func() *flov1.WorkerMessage) {
	select {
	case l.handle <- handle:
	default:
		go l.runHandlers(handle)
	}
}

// runHandlers runs handle and then whatever dispatch passes it, until it has waited
// handlerIdle for more or Start returned. For each it queues the report the handler returns
// (nil: nothing to report) and frees the slot.
func (l *lifecycle) runHandlers(handle func() *flov1.WorkerMessage) {
	idle := time.NewTimer(handlerIdle)
	defer idle.Stop()
	for {
		if msg := handle(); msg != nil {
			l.queue(msg)
		}
		l.slots.release()
		poke(l.slotFreed)
		poke(l.wake)
		idle.Reset(handlerIdle)
		select {
		case handle = <-l.handle:
		case <-idle.C:
			return
		case <-l.quit:
			return
		}
	}
}

// queue hands a report to the writer, waiting while the outbound buffer is full, unless Start
// has returned and nobody would send it.
func (l *lifecycle) queue(msg *flov1.WorkerMessage) {
	select {
	case l.out <- msg:
	case <-l.quit:
	}
}

// enqueue hands a message to the writer, waiting while the outbound buffer is full.
func (l *lifecycle) enqueue(ctx context.Context, msg *flov1.WorkerMessage) error {
	select {
	case l.out <- msg:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.quit:
		return ErrWorkerClosed
	}
}

// fatal reports whether the server refused the worker for a reason reconnecting cannot fix:
// a bad token or request, an unknown namespace, stream or group, or a broken protocol.
func fatal(err error) bool {
	if errors.Is(err, ErrNotConnected) {
		return true
	}
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.Unimplemented,
		codes.NotFound, codes.FailedPrecondition:
		return true
	}
	return false
}

// poke signals c without blocking; one pending signal is enough for its reader.
func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// parentTrace is a task's or record's trace context as it arrived, as pairs (comparing
// with them costs less than iterating a map), and as extracted.
type parentTrace struct {
	carrier [][2]string
	ctx     context.Context
}

// carries reports whether carrier holds exactly what p arrived with.
func (p *parentTrace) carries(carrier map[string]string) bool {
	if len(carrier) != len(p.carrier) {
		return false
	}
	for _, kv := range p.carrier {
		if v, ok := carrier[kv[0]]; !ok || v != kv[1] {
			return false
		}
	}
	return true
}

// parent returns the worker's base context carrying the trace context a task or record
// arrived with.
func (l *lifecycle) parent(carrier map[string]string) context.Context {
	if len(carrier) == 0 {
		return l.base
	}
	if last := l.lastParent.Load(); last != nil && last.carries(carrier) {
		return last.ctx
	}
	p := &parentTrace{carrier: make([][2]string, 0, len(carrier))}
	for k, v := range carrier {
		p.carrier = append(p.carrier, [2]string{k, v})
	}
	p.ctx = otel.GetTextMapPropagator().Extract(l.base, propagation.MapCarrier(carrier))
	l.lastParent.Store(p)
	return p.ctx
}
