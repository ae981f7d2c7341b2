package flo

import (
	"context"
	"errors"
	"fmt"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// maxBatchBytes keeps a ResultBatch well under gRPC's default 4 MiB message limit even when
// handlers return large bodies; a larger single result goes alone.
const maxBatchBytes = 2 << 20

// errDrained ends the writer of a stopping worker that has reported everything.
var errDrained = errors.New("flo: worker drained")

type workerStream = grpc.BidiStreamingClient[flov1.WorkerMessage, flov1.ServerMessage]

// session runs one worker stream from hello to its end. It returns nil when a stopping worker
// has reported everything and closed the stream, and otherwise why the stream ended; connected
// says whether the server accepted the hello, which resets the reconnect backoff.
func (w *ActionWorker) session(ctx context.Context) (connected bool, err error) {
	svc, err := w.client.workerService()
	if err != nil {
		return false, err
	}
	// The stream outlives ctx on purpose: a stopping worker still reports on it.
	streamCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stream, err := svc.Stream(streamCtx)
	if err != nil {
		return false, fmt.Errorf("open worker stream: %w", err)
	}
	actions := w.actionNames()
	hello := &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{
		Token:          w.client.token,
		WorkerId:       w.opts.WorkerID,
		Namespace:      w.client.namespace,
		MachineId:      w.opts.MachineID,
		Actions:        actions,
		MaxConcurrency: int32(w.opts.Concurrency),
	}}}
	if err := stream.Send(hello); err != nil {
		if _, recvErr := stream.Recv(); recvErr != nil {
			err = recvErr // Send reports io.EOF; Recv has the server's reason
		}
		return false, fmt.Errorf("send hello: %w", err)
	}
	helloTimer := time.AfterFunc(helloTimeout, cancel)
	first, err := stream.Recv()
	helloTimer.Stop()
	if err != nil {
		return false, fmt.Errorf("wait for hello ack: %w", err)
	}
	if first.GetHelloAck() == nil {
		return false, fmt.Errorf("wait for hello ack: got %T instead", first.GetMsg())
	}
	w.log.Info("flo: worker stream connected", "actions", actions, "concurrency", w.opts.Concurrency)

	// Credit asked for on an earlier stream died with it; ask again for every free slot.
	w.slots.reset()

	readerDone := make(chan struct{})
	var readErr error
	go func() {
		defer close(readerDone)
		readErr = w.readLoop(streamCtx, stream)
	}()

	err = w.writeLoop(stream, actions, readerDone)
	if errors.Is(err, errDrained) {
		err = nil
		if closeErr := stream.CloseSend(); closeErr == nil {
			select {
			case <-readerDone:
			case <-time.After(closeTimeout):
			}
		}
	}
	cancel()
	<-readerDone
	w.failTouches("worker stream closed")
	if err == nil {
		return true, nil
	}
	if errors.Is(err, errReaderDone) {
		err = readErr
	}
	return true, err
}

// errReaderDone tells session that the reader ended the stream and its error is the cause.
var errReaderDone = errors.New("flo: worker stream reader ended")

// readLoop receives what the server sends: tasks, which it starts as slots allow, touch
// answers, refused results and the news that the worker is draining.
func (w *ActionWorker) readLoop(ctx context.Context, stream workerStream) error {
	for {
		msg, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		switch m := msg.GetMsg().(type) {
		case *flov1.ServerMessage_TaskBatch:
			tasks := m.TaskBatch.GetTasks()
			if len(tasks) == 0 {
				// The oldest Ready expired with credit left: the writer asks for it again.
				w.slots.expire()
				poke(w.wake)
				continue
			}
			for _, task := range tasks {
				if err := w.startTask(ctx, task); err != nil {
					return err
				}
			}
		case *flov1.ServerMessage_TouchAck:
			w.deliverTouchAck(m.TouchAck)
		case *flov1.ServerMessage_Drain:
			w.drain("the server sent Drain")
		case *flov1.ServerMessage_ResultAck:
			if ids := m.ResultAck.GetRejectedTaskIds(); len(ids) > 0 {
				w.log.Warn("flo: server refused results", "task_ids", ids, "error", m.ResultAck.GetError())
			}
		}
	}
}

// startTask takes a slot for task and runs it. Without a free slot (the server sent more than
// was asked for) it waits, which stops reading the stream: back-pressure instead of a queue.
// A stopping worker hands new tasks straight back.
func (w *ActionWorker) startTask(ctx context.Context, task *flov1.TaskAssignment) error {
	for {
		if w.stopping.Load() {
			w.slots.consume()
			return w.enqueue(ctx, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Abandon{Abandon: &flov1.Abandon{
				TaskId: task.GetTaskId(), Attempt: task.GetAttempt(),
			}}})
		}
		if w.slots.acquire() {
			break
		}
		select {
		case <-w.slotFreed:
		case <-w.stopCh:
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	h, ok := w.handler(task.GetAction())
	if !ok {
		h = func(*ActionContext) (string, []byte, error) {
			return "", nil, fmt.Errorf("worker %s has no handler for action %s", w.opts.WorkerID, task.GetAction())
		}
	}
	go func() {
		msg := w.execute(w.base, task, h)
		select {
		case w.out <- msg:
		case <-w.quit:
		}
		w.slots.release()
		poke(w.slotFreed)
		poke(w.wake)
	}()
	return nil
}

// enqueue hands a message to the writer, waiting while the outbound buffer is full.
func (w *ActionWorker) enqueue(ctx context.Context, msg *flov1.WorkerMessage) error {
	select {
	case w.out <- msg:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.quit:
		return ErrWorkerClosed
	}
}

// writeLoop is the only sender on the stream. Each time it wakes it sends everything queued:
// Nack, Abandon and Touch one by one, all results as one ResultBatch, then one Ready for all
// the credit freed slots gave back. It returns errDrained once a stopping worker has nothing
// left to report, or errReaderDone when the reader ended.
func (w *ActionWorker) writeLoop(stream workerStream, actions []string, readerDone <-chan struct{}) error {
	stopCh := w.stopCh
	var drainTimeout <-chan time.Time
	for {
		if err := w.flush(stream, actions); err != nil {
			return err
		}
		if w.stopping.Load() {
			if w.nothingToReport() {
				return errDrained
			}
			if drainTimeout == nil {
				timer := time.NewTimer(time.Until(w.drainDeadline))
				defer timer.Stop()
				drainTimeout = timer.C
			}
		}
		select {
		case msg := <-w.out:
			w.unsent = append(w.unsent, msg)
		case <-w.wake:
		case <-stopCh:
			stopCh = nil
		case <-readerDone:
			return errReaderDone
		case <-drainTimeout:
			w.log.Warn("flo: handlers still running after the action timeout; closing the stream without their results")
			return errDrained
		}
	}
}

// flush sends what is queued. Messages stay in unsent until the stream takes them, so a
// stream that breaks halfway loses nothing: the next stream sends them again, and the server
// ignores reports for attempts that are no longer current.
func (w *ActionWorker) flush(stream workerStream, actions []string) error {
	for drained := false; !drained; {
		select {
		case msg := <-w.out:
			w.unsent = append(w.unsent, msg)
		default:
			drained = true
		}
	}
	var batch []*flov1.Result
	kept := w.unsent[:0]
	for _, msg := range w.unsent {
		if r := msg.GetResult(); r != nil {
			batch = append(batch, r)
			continue
		}
		kept = append(kept, msg)
	}
	for i, msg := range kept {
		if err := stream.Send(msg); err != nil {
			w.unsent = append(kept[i:], resultsMessages(batch)...)
			return fmt.Errorf("send %T: %w", msg.GetMsg(), err)
		}
	}
	w.unsent = w.unsent[:0]
	for len(batch) > 0 {
		n, size := 0, 0
		for n < len(batch) && (n == 0 || size+proto.Size(batch[n]) <= maxBatchBytes) {
			size += proto.Size(batch[n])
			n++
		}
		msg := &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_ResultBatch{ResultBatch: &flov1.ResultBatch{Results: batch[:n]}}}
		if err := stream.Send(msg); err != nil {
			w.unsent = resultsMessages(batch)
			return fmt.Errorf("send result batch: %w", err)
		}
		batch = batch[n:]
	}
	if credit := w.takeCredit(); credit > 0 {
		ready := &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Ready{Ready: &flov1.Ready{
			Actions: actions,
			Count:   int32(credit),
			BlockMs: w.opts.BlockMS,
			LeaseMs: w.opts.LeaseMS,
		}}}
		if err := stream.Send(ready); err != nil {
			return fmt.Errorf("send ready: %w", err)
		}
	}
	return nil
}

func resultsMessages(results []*flov1.Result) []*flov1.WorkerMessage {
	msgs := make([]*flov1.WorkerMessage, 0, len(results))
	for _, r := range results {
		msgs = append(msgs, resultMessage(r))
	}
	return msgs
}

// takeCredit returns how many more tasks to ask for; a stopping worker asks for none.
func (w *ActionWorker) takeCredit() int {
	if w.stopping.Load() {
		return 0
	}
	return w.slots.grant()
}

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
