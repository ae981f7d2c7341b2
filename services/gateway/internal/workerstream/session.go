package workerstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"

	"github.com/razorbill/flo/libs/millis"
	"github.com/razorbill/flo/libs/text"
)

// outgoing is one message for the writer. tasks lists the claimed tasks it
// carries, so they can be abandoned when the message is never sent; records
// likewise names the records of a RecordBatch, to be nacked.
type outgoing struct {
	msg     *flov1.ServerMessage
	tasks   []*flov1.TaskAssignment
	records *delivery
}

// group runs goroutines the session must wait for before it ends. Once
// closed it refuses new ones, so nothing starts after the session waited.
type group struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (g *group) Go(fn func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Go(fn)
	return true
}

func (g *group) closeAndWait() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.wg.Wait()
}

// session is one worker stream after its Hello.
type session struct {
	srv       *Server
	stream    flov1.WorkerService_StreamServer
	namespace string
	workerID  string
	// keyID is the key the stream was opened with; only a stream of the
	// same worker and key adopts what this one holds.
	keyID   string
	actions []string
	log     *slog.Logger

	// ctx ends with the session; claimCtx ends when it stops claiming, which
	// on shutdown is earlier; calls outlives the stream so that results a
	// worker sent are recorded even when it disconnects right after.
	ctx          context.Context
	cancel       context.CancelFunc
	claimCtx     context.Context
	stopClaiming context.CancelFunc
	calls        context.Context

	// out is the writer's queue; the writer runs while it holds messages.
	// sendBroken, touched only by the writer, is set once a Send failed.
	out        runQueue[outgoing]
	sendBroken bool

	failOnce sync.Once
	failed   chan struct{}
	failErr  error

	slots chan struct{}
	// results carries the reader's Result and ResultBatch messages to
	// reportResults, which records everything queued with one Report call.
	results  runQueue[[]*flov1.Result]
	ops      group
	claimers group

	poolsMu sync.Mutex
	pools   map[string]*pool

	held *held

	// subs are the Hello's stream subscriptions by "stream/group"; the set is
	// fixed, their outstanding reads are guarded by readsMu. Once readsClosed
	// (a drain) no read is started or answered with records again; once
	// readsEnded (the session is ending) nothing more is queued for the
	// writer by a read either, since the queue is about to close.
	subs        map[string]*subscription
	readsMu     sync.Mutex
	readsClosed bool
	readsEnded  bool
	// readsShut is readsClosed for the read hubs, which check it without
	// readsMu: a read handed to a hub after it is set is dropped.
	readsShut atomic.Bool
	// settles carries StreamAck and StreamNack messages to settleQueued.
	settles runQueue[settle]
	// records are the records sent and not yet acked or nacked here, which a
	// shutdown waits for like held tasks.
	records *heldRecords

	// workerDraining is set once the worker is draining: nothing more is
	// claimed or sent to it, while its reports keep flowing.
	workerDraining atomic.Bool
	drainOnce      sync.Once
}

// newSession returns the session of one stream. maxConcurrency, when
// positive, caps the tasks the stream holds at once, whatever credit its
// Ready messages grant.
func newSession(srv *Server, stream flov1.WorkerService_StreamServer, namespace, workerID, keyID string, actions []string, subs map[string]*subscription, maxConcurrency int, log *slog.Logger) *session {
	limit := maxHeld
	if maxConcurrency > 0 {
		limit = min(maxConcurrency, maxHeld)
	}
	ctx, cancel := context.WithCancel(stream.Context())
	claimCtx, stopClaiming := context.WithCancel(ctx)
	s := &session{
		srv:          srv,
		stream:       stream,
		namespace:    namespace,
		workerID:     workerID,
		keyID:        keyID,
		actions:      actions,
		log:          log,
		ctx:          ctx,
		cancel:       cancel,
		claimCtx:     claimCtx,
		stopClaiming: stopClaiming,
		calls:        context.WithoutCancel(stream.Context()),
		failed:       make(chan struct{}),
		slots:        make(chan struct{}, maxInFlight),
		pools:        make(map[string]*pool),
		held:         newHeld(limit),
		subs:         subs,
		records:      newHeldRecords(),
	}
	s.out.init(sendQueue, s.write)
	s.results.init(sendQueue, s.reportQueued)
	s.settles.init(sendQueue, s.settleQueued)
	return s
}

// run serves the session until the worker closes its side, the stream
// breaks, a permanent error occurs or the gateway shuts down; then it stops
// claiming, waits for in-flight calls and queued reports and settles, lets
// the writer finish and returns the status the stream ends with. An idle
// session is this goroutine and the reader: the writer and the goroutines
// recording reports and settles run only while they have something queued.
func (s *session) run() error {
	s.ops.Go(s.checkRegistry)
	readDone := make(chan error, 1)
	go func() { readDone <- s.read() }()

	var err error
	select {
	case err = <-readDone:
	case <-s.failed:
		err = s.failErr
	case <-s.srv.shutdown:
		err = s.drain(readDone)
	}
	s.stopClaiming()
	s.cancel()
	s.closeReads(false)
	s.claimers.closeAndWait()
	s.ops.closeAndWait()
	s.results.close()
	s.settles.close()
	s.out.close()
	return err
}

// drain stops claiming and reading records and waits, up to the drain
// timeout, for the worker to report every task and settle every record it
// holds.
func (s *session) drain(readDone <-chan error) error {
	s.stopClaiming()
	s.closeReads(true)
	timer := time.NewTimer(s.srv.opts.DrainTimeout)
	defer timer.Stop()
	heldEmptied, recordsEmptied := s.held.emptied(), s.records.emptied()
	for s.held.len() > 0 || s.records.len(time.Now()) > 0 {
		select {
		case err := <-readDone:
			return err
		case <-s.failed:
			return s.failErr
		case <-heldEmptied:
		case <-recordsEmptied:
		case <-timer.C:
			return errShuttingDown
		}
	}
	return errShuttingDown
}

// fail ends the session with err; the first failure wins.
func (s *session) fail(err error) {
	s.failOnce.Do(func() {
		s.failErr = err
		close(s.failed)
	})
}

// write sends one queued message; the writer's queue calls it, one message
// at a time, so it is the only caller of Send. Once a send fails, once the
// session ended, or once the worker is draining, task batches still queued
// are abandoned instead of sent, and record batches are nacked (a live,
// draining worker gets the empty answer its read still waits for).
func (s *session) write(item outgoing) {
	if d := item.records; d != nil && (s.sendBroken || s.ctx.Err() != nil || s.workerDraining.Load()) {
		s.records.remove(d.stream, d.group, d.ids)
		s.handBack(d, false)
		if !s.sendBroken && s.ctx.Err() == nil {
			if err := s.stream.Send(emptyRecordBatch(item.records.stream, item.records.group)); err != nil {
				s.sendBroken = true
				s.fail(err)
			}
		}
		return
	}
	if s.sendBroken || (len(item.tasks) > 0 && (s.ctx.Err() != nil || s.workerDraining.Load())) {
		if len(item.tasks) > 0 {
			s.abandon(item.tasks)
		}
		return
	}
	if err := s.stream.Send(item.msg); err != nil {
		s.sendBroken = true
		s.fail(err)
		if len(item.tasks) > 0 {
			s.abandon(item.tasks)
		}
		if d := item.records; d != nil {
			s.records.remove(d.stream, d.group, d.ids)
			s.handBack(d, true)
		}
	}
}

// enqueue hands a message to the writer, waiting while its queue is full;
// it reports false when the session ended first.
func (s *session) enqueue(item outgoing) bool {
	return s.out.put(item, s.ctx.Done())
}

// read handles incoming messages until the worker closes its side or the
// stream breaks.
func (s *session) read() error {
	for {
		msg, err := s.stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.handle(msg); err != nil {
			return err
		}
	}
}

func (s *session) handle(msg *flov1.WorkerMessage) error {
	switch m := msg.GetMsg().(type) {
	case *flov1.WorkerMessage_Hello:
		return status.Error(codes.InvalidArgument, "Hello may be sent only once per stream")
	case *flov1.WorkerMessage_Ready:
		return s.ready(m.Ready)
	case *flov1.WorkerMessage_Result:
		s.queueResults([]*flov1.Result{m.Result})
	case *flov1.WorkerMessage_ResultBatch:
		s.queueResults(m.ResultBatch.GetResults())
	case *flov1.WorkerMessage_Nack:
		n := m.Nack
		if !s.ownsTask(n.GetTaskId(), n.GetAttempt()) {
			s.rejectUnheld([]string{n.GetTaskId()})
			return nil
		}
		n.Reason = text.Clean(n.GetReason(), text.MaxFreeBytes)
		s.spawn(func() {
			s.reportAndAck([]*dispatcherv1.Report{{
				TaskId: n.GetTaskId(), Attempt: n.GetAttempt(), Kind: &dispatcherv1.Report_Nack{Nack: n},
			}})
		})
	case *flov1.WorkerMessage_Abandon:
		a := m.Abandon
		if !s.ownsTask(a.GetTaskId(), a.GetAttempt()) {
			s.rejectUnheld([]string{a.GetTaskId()})
			return nil
		}
		s.spawn(func() {
			s.reportAndAck([]*dispatcherv1.Report{{
				TaskId: a.GetTaskId(), Attempt: a.GetAttempt(), Kind: &dispatcherv1.Report_Abandon{Abandon: a},
			}})
		})
	case *flov1.WorkerMessage_Touch:
		t := m.Touch
		if !s.ownsTask(t.GetTaskId(), t.GetAttempt()) {
			s.enqueue(outgoing{msg: &flov1.ServerMessage{Msg: &flov1.ServerMessage_TouchAck{TouchAck: &flov1.TouchAck{
				TaskId: t.GetTaskId(), Error: errNotHeld,
			}}}})
			return nil
		}
		s.spawn(func() { s.touch(t) })
	case *flov1.WorkerMessage_Heartbeat:
		s.heartbeat(m.Heartbeat)
	case *flov1.WorkerMessage_StreamRead:
		return s.streamRead(m.StreamRead)
	case *flov1.WorkerMessage_StreamAck:
		a := m.StreamAck
		return s.queueSettle(settle{stream: a.GetStream(), group: a.GetGroup(), ids: a.GetIds()})
	case *flov1.WorkerMessage_StreamNack:
		n := m.StreamNack
		if n.GetDelayMs() < 0 {
			return status.Errorf(codes.InvalidArgument, "StreamNack's delay_ms %d must not be negative", n.GetDelayMs())
		}
		return s.queueSettle(settle{stream: n.GetStream(), group: n.GetGroup(), ids: n.GetIds(), nack: true, delayMS: n.GetDelayMs(),
			reason: text.Clean(n.GetReason(), text.MaxFreeBytes)})
	default:
		return status.Error(codes.InvalidArgument, "empty worker message")
	}
	return nil
}

// spawn runs fn as one of at most maxInFlight concurrent calls, waiting for a
// slot; while it waits the reader reads nothing, which is the back-pressure
// on a worker sending faster than the dispatcher records.
func (s *session) spawn(fn func()) {
	select {
	case s.slots <- struct{}{}:
	case <-s.ctx.Done():
		return
	}
	if !s.ops.Go(func() {
		defer func() { <-s.slots }()
		fn()
	}) {
		<-s.slots
	}
}

// queueResults hands results to reportQueued, waiting while its queue is
// full; while it waits the reader reads nothing (back-pressure, as in
// spawn).
func (s *session) queueResults(results []*flov1.Result) {
	if len(results) == 0 {
		return
	}
	s.results.put(results, s.ctx.Done())
}

// reportQueued records results as they come, everything queued at once:
// while one Report call is in flight the next batch gathers, so a busy
// stream makes a few large calls instead of one per ResultBatch (each call
// costs far more than its reports). What is queued when the session ends is
// recorded before the session returns.
func (s *session) reportQueued(first []*flov1.Result) {
	s.reportResults(s.gather(first))
}

// gather appends the queued results to batch, up to maxReportResults
// results or maxReportBytes of bodies.
func (s *session) gather(batch []*flov1.Result) []*flov1.Result {
	size := 0
	for _, r := range batch {
		size += len(r.GetCompleted().GetBody())
	}
	for len(batch) < maxReportResults && size < maxReportBytes {
		rs, ok := s.results.next()
		if !ok {
			break
		}
		batch = append(batch, rs...)
		for _, r := range rs {
			size += len(r.GetCompleted().GetBody())
		}
	}
	return batch
}

// ready adds a Ready's credit to the pool of its actions and lease length,
// which its hub claims for.
func (s *session) ready(r *flov1.Ready) error {
	actions := r.GetActions()
	if len(actions) == 0 {
		actions = s.actions
	} else {
		actions = slices.Compact(slices.Sorted(slices.Values(actions)))
	}
	if len(actions) == 0 {
		return status.Error(codes.InvalidArgument, "Ready names no actions and the Hello named none")
	}
	if len(actions) > MaxHelloActions {
		return status.Errorf(codes.InvalidArgument, "Ready names %d actions, at most %d", len(actions), MaxHelloActions)
	}
	for _, name := range actions {
		if err := text.Name("Ready's action", name); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	if r.GetLeaseMs() < 0 || r.GetBlockMs() < 0 {
		return status.Error(codes.InvalidArgument, "Ready's lease_ms and block_ms must not be negative")
	}
	block := defaultBlock
	if r.GetBlockMs() > 0 {
		block = min(millis.Duration(r.GetBlockMs()), maxBlock)
	}
	if s.workerDraining.Load() {
		// A draining worker gets nothing new; its Ready is answered by
		// nothing, as the Drain message told it to expect.
		return nil
	}
	p, err := s.pool(actions, r.GetLeaseMs())
	if err != nil {
		return err
	}
	p.add(max(int(r.GetCount()), 1), time.Now().Add(block))
	return nil
}

func (s *session) pool(actions []string, leaseMS int64) (*pool, error) {
	key := poolKey(actions, leaseMS)
	s.poolsMu.Lock()
	defer s.poolsMu.Unlock()
	if p, ok := s.pools[key]; ok {
		return p, nil
	}
	if len(s.pools) >= maxPools {
		return nil, status.Errorf(codes.InvalidArgument, "a stream's Ready messages may name at most %d different action sets and lease lengths", maxPools)
	}
	h := s.srv.hub(s.namespace, actions, leaseMS)
	p := newPool(s, h, actions, leaseMS)
	s.pools[key] = p
	// Claiming ends with claimCtx: then the pool leaves its hub.
	context.AfterFunc(s.claimCtx, func() { h.stop(p) })
	return p, nil
}

// wakePools has the pools' hubs look again at what they want, now that the
// session has more room.
func (s *session) wakePools() {
	s.poolsMu.Lock()
	defer s.poolsMu.Unlock()
	for _, p := range s.pools {
		p.signal()
	}
}

// reportResults sends one Result or ResultBatch to the dispatcher as one
// Report call. A result body over the payload limit is recorded as a
// failure that dead-letters the task, so the user sees why instead of a
// lease expiring over and over.
func (s *session) reportResults(results []*flov1.Result) {
	reports := make([]*dispatcherv1.Report, 0, len(results))
	var invalid, unheld []string
	for _, r := range results {
		if !s.ownsTask(r.GetTaskId(), r.GetAttempt()) {
			unheld = append(unheld, r.GetTaskId())
			continue
		}
		rep := &dispatcherv1.Report{TaskId: r.GetTaskId(), Attempt: r.GetAttempt(), TraceContext: r.GetTraceContext()}
		switch o := r.GetOutcome().(type) {
		case *flov1.Result_Completed:
			if n := len(o.Completed.GetBody()); n > s.srv.opts.MaxPayloadBytes {
				rep.Kind = &dispatcherv1.Report_Failed{Failed: &flov1.Failed{
					Error: fmt.Sprintf("result is %d bytes, limit is %d", n, s.srv.opts.MaxPayloadBytes),
				}}
			} else {
				o.Completed.Outcome = text.Clean(o.Completed.GetOutcome(), text.MaxOutcomeBytes)
				rep.Kind = &dispatcherv1.Report_Completed{Completed: o.Completed}
			}
		case *flov1.Result_Failed:
			// Free text is cleaned and capped here, before it travels, and
			// again by the dispatcher for records that skip the gateway; an
			// invalid error code is dropped with a note, not refused.
			o.Failed.Error, o.Failed.ErrorCode = text.CleanFailure(o.Failed.GetError(), o.Failed.GetErrorCode())
			rep.Kind = &dispatcherv1.Report_Failed{Failed: o.Failed}
		case *flov1.Result_Pending:
			rep.Kind = &dispatcherv1.Report_Pending{Pending: o.Pending}
		default:
			invalid = append(invalid, r.GetTaskId())
			continue
		}
		reports = append(reports, rep)
	}
	rejected, why := s.report(reports)
	if len(invalid) > 0 {
		rejected = append(rejected, invalid...)
		why = joinReasons(why, "a Result must carry completed or failed")
	}
	if len(unheld) > 0 {
		rejected = append(rejected, unheld...)
		why = joinReasons(why, errNotHeld)
	}
	s.ackRejected(rejected, why)
}

// errNotHeld is why a report of a task the stream does not hold is refused.
const errNotHeld = "this worker stream does not hold the task: a worker reports only tasks sent to it"

// reportAndAck records reports and sends a ResultAck when any was refused.
func (s *session) reportAndAck(reports []*dispatcherv1.Report) {
	s.ackRejected(s.report(reports))
}

// rejectUnheld answers reports of tasks the stream does not hold, without
// asking the dispatcher.
func (s *session) rejectUnheld(ids []string) { s.ackRejected(ids, errNotHeld) }

// ackRejected sends the ResultAck that names refused reports, if any.
func (s *session) ackRejected(rejected []string, why string) {
	if len(rejected) == 0 {
		return
	}
	s.enqueue(outgoing{msg: &flov1.ServerMessage{Msg: &flov1.ServerMessage_ResultAck{ResultAck: &flov1.ResultAck{
		RejectedTaskIds: rejected, Error: why,
	}}}})
}

func joinReasons(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// report makes one Report call, retried while the dispatcher is unavailable,
// and returns the task ids it refused with the reason.
func (s *session) report(reports []*dispatcherv1.Report) (rejected []string, why string) {
	// An abandoned attempt keeps its number and may come back to this
	// stream as soon as the abandon is recorded: it is forgotten first.
	var abandoned, ended []*dispatcherv1.Report
	for _, r := range reports {
		if r.GetAbandon() != nil {
			abandoned = append(abandoned, r)
		} else {
			ended = append(ended, r)
		}
	}
	if s.held.remove(attemptKeys(abandoned)) {
		s.wakePools()
	}
	rejected, why = s.send(reports)
	if s.held.remove(attemptKeys(ended)) {
		s.wakePools()
	}
	return rejected, why
}

// send records reports with the dispatcher, retrying what can be retried.
func (s *session) send(reports []*dispatcherv1.Report) (rejected []string, why string) {
	if len(reports) == 0 {
		return nil, ""
	}
	ctx, cancel := context.WithTimeout(s.calls, callTimeout)
	defer cancel()
	var resp *dispatcherv1.ReportResponse
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = s.srv.dispatcher.Report(ctx, &dispatcherv1.ReportRequest{
			Namespace: s.namespace, WorkerId: s.workerID, Reports: reports,
		})
		return err
	})
	if err != nil {
		s.log.WarnContext(ctx, "report results failed", slog.Int("reports", len(reports)), slog.Any("error", err))
		ids := make([]string, len(reports))
		for i, r := range reports {
			ids[i] = r.GetTaskId()
		}
		return ids, "recording the results failed: " + status.Convert(err).Message()
	}
	if len(resp.GetRejectedTaskIds()) > 0 {
		return resp.GetRejectedTaskIds(), "no running attempt matched: the lease expired or the task is already final"
	}
	return nil, ""
}

// attemptKeys are the held-set keys of reports' attempts.
func attemptKeys(reports []*dispatcherv1.Report) []string {
	keys := make([]string, len(reports))
	for i, r := range reports {
		keys[i] = attemptKey(r.GetTaskId(), r.GetAttempt())
	}
	return keys
}

// abandon hands tasks the worker never received back to the queue without
// counting an attempt (report forgets them before the call). Tasks it never
// held, a claim's late answer, are not in the held set.
func (s *session) abandon(tasks []*flov1.TaskAssignment) {
	if rejected, why := s.report(abandonReports(tasks)); len(rejected) > 0 {
		s.log.WarnContext(s.calls, "abandon unsent tasks failed; they return to the queue when their lease expires",
			slog.Int("tasks", len(rejected)), slog.String("reason", why))
	}
}

// touch extends a lease and answers with a TouchAck either way.
func (s *session) touch(t *flov1.Touch) {
	ctx, cancel := context.WithTimeout(s.calls, touchTimeout)
	defer cancel()
	var ack *flov1.TouchAck
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		ack, err = s.srv.dispatcher.Touch(ctx, &dispatcherv1.TouchRequest{
			Namespace: s.namespace, WorkerId: s.workerID,
			TaskId: t.GetTaskId(), Attempt: t.GetAttempt(), ExtendMs: t.GetExtendMs(),
		})
		return err
	})
	if err != nil {
		ack = &flov1.TouchAck{TaskId: t.GetTaskId(), Error: status.Convert(err).Message()}
	}
	if ack.GetOk() && ack.GetLeaseUntil() != nil {
		s.held.extend(attemptKey(t.GetTaskId(), t.GetAttempt()), ack.GetLeaseUntil().AsTime())
	}
	s.enqueue(outgoing{msg: &flov1.ServerMessage{Msg: &flov1.ServerMessage_TouchAck{TouchAck: ack}}})
}
