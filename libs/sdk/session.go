package flo

import (
	"context"
	"errors"
	"fmt"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"google.golang.org/grpc"
)

// errDrained ends the writer of a stopping worker that has reported everything.
var errDrained = errors.New("flo: worker drained")

// errReaderDone tells session that the reader ended the stream and its error is the cause.
var errReaderDone = errors.New("flo: worker stream reader ended")

type workerStream = grpc.BidiStreamingClient[flov1.WorkerMessage, flov1.ServerMessage]

// session runs one worker stream from hello to its end. It returns nil when a stopping worker
// has reported everything and closed the stream, and otherwise why the stream ended; connected
// says whether the server accepted the hello, which resets the reconnect backoff.
func (l *lifecycle) session(ctx context.Context) (connected bool, err error) {
	svc, err := l.client.workerService()
	if err != nil {
		return false, err
	}
	if !l.prepared {
		if err := l.kind.prepare(ctx); err != nil {
			return false, err
		}
		l.prepared = true
	}
	// The stream outlives ctx on purpose: a stopping worker still reports on it.
	streamCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stream, err := svc.Stream(streamCtx)
	if err != nil {
		return false, fmt.Errorf("open worker stream: %w", err)
	}
	hello := &flov1.Hello{
		Token:          l.client.token,
		WorkerId:       l.set.workerID,
		Namespace:      l.client.namespace,
		MachineId:      l.set.machineID,
		MaxConcurrency: int32(l.set.concurrency),
	}
	l.kind.hello(hello)
	if err := stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: hello}}); err != nil {
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
	attrs := []any{"concurrency", l.set.concurrency}
	if len(hello.GetActions()) > 0 {
		attrs = append(attrs, "actions", hello.GetActions())
	}
	for _, s := range hello.GetStreams() {
		attrs = append(attrs, "stream", s.GetStream(), "group", s.GetGroup(), "consumer", s.GetConsumer())
	}
	l.log.Info("flo: worker stream connected", attrs...)
	// Heartbeats go on the stream while it is up, if its gateway takes them.
	var line *beatLine
	if first.GetHelloAck().GetStreamHeartbeats() {
		line = newBeatLine()
		l.beats.Store(line)
		defer func() {
			l.beats.CompareAndSwap(line, nil)
			close(line.done)
		}()
	}

	// Credit asked for on an earlier stream died with it; ask again for every free slot.
	l.slots.reset()

	readerDone := make(chan struct{})
	var readErr error
	go func() {
		defer close(readerDone)
		readErr = l.readLoop(streamCtx, stream, line)
	}()

	err = l.writeLoop(stream, readerDone, line)
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
	l.kind.streamEnded()
	if err == nil {
		return true, nil
	}
	if errors.Is(err, errReaderDone) {
		err = readErr
	}
	return true, err
}

// readLoop receives what the server sends: Drain it handles itself, a HeartbeatAck goes to the
// heartbeat waiting on line, the rest is the kind's.
func (l *lifecycle) readLoop(ctx context.Context, stream workerStream, line *beatLine) error {
	for {
		msg, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		if msg.GetDrain() != nil {
			l.drain("the server sent Drain")
			continue
		}
		if ack := msg.GetHeartbeatAck(); ack != nil {
			if line != nil {
				select {
				case line.acks <- ack:
				default: // nobody waits for it any more
				}
			}
			continue
		}
		if err := l.kind.receive(ctx, msg); err != nil {
			return err
		}
	}
}

// writeLoop is the only sender on the stream. Each time it wakes it sends everything queued,
// packed by the kind (reports the kind holds back, see reportWait, when they are due), then
// one request for the work the free slots allow; a heartbeat on line it sends at once. It
// returns errDrained once a stopping worker has nothing left to report, or errReaderDone when
// the reader ended.
func (l *lifecycle) writeLoop(stream workerStream, readerDone <-chan struct{}, line *beatLine) error {
	stopCh := l.stopCh
	var beats <-chan *flov1.WorkerMessage
	if line != nil {
		beats = line.send
	}
	var (
		drainTimeout <-chan time.Time
		// lastReports is when reports last went out; reportsDue fires when held ones are due.
		lastReports time.Time
		reportsDue  <-chan time.Time
	)
	for {
		wait := l.reportWait(lastReports)
		sent, err := l.flush(stream, wait == 0)
		if err != nil {
			return err
		}
		if sent {
			lastReports = time.Now()
		}
		if wait > 0 && reportsDue == nil {
			reportsDue = time.After(wait)
		}
		if l.stopping.Load() {
			if l.nothingToReport() {
				return errDrained
			}
			if drainTimeout == nil {
				timer := time.NewTimer(time.Until(l.drainDeadline))
				defer timer.Stop()
				drainTimeout = timer.C
			}
		}
		select {
		case msg := <-l.out:
			l.unsent = append(l.unsent, msg)
		case <-l.wake:
		case msg := <-beats:
			if err := stream.Send(msg); err != nil {
				return fmt.Errorf("send heartbeat: %w", err)
			}
		case <-reportsDue:
			reportsDue = nil
		case <-stopCh:
			stopCh = nil
		case <-readerDone:
			return errReaderDone
		case <-drainTimeout:
			l.log.Warn("flo: handlers still running after their timeout; closing the stream without their reports")
			return errDrained
		}
	}
}

// reportWait is how much longer queued reports wait before they go out: none unless the kind
// holds reports (reportDelay), handlers are still running (so more reports are coming), the
// worker is not stopping and the last reports went out less than reportDelay ago.
func (l *lifecycle) reportWait(last time.Time) time.Duration {
	if l.set.reportDelay == 0 || l.stopping.Load() || l.slots.running() == 0 {
		return 0
	}
	return max(l.set.reportDelay-time.Since(last), 0)
}

// flush sends what is queued, the reports only when reports is set, and says whether it sent
// reports. Messages stay in unsent until the stream takes them, so a stream that breaks halfway
// loses nothing: the next stream sends them again, and the server ignores reports it already
// has or that are no longer current.
func (l *lifecycle) flush(stream workerStream, reports bool) (sent bool, err error) {
	for drained := false; !drained; {
		select {
		case msg := <-l.out:
			l.unsent = append(l.unsent, msg)
		default:
			drained = true
		}
	}
	if reports && len(l.unsent) > 0 {
		msgs := l.kind.pack(l.unsent)
		l.unsent = l.unsent[:0]
		for i, msg := range msgs {
			if err := stream.Send(msg); err != nil {
				l.unsent = msgs[i:]
				return true, fmt.Errorf("send %T: %w", msg.GetMsg(), err)
			}
		}
		sent = true
	}
	if l.stopping.Load() {
		return sent, nil
	}
	if req := l.kind.request(); req != nil {
		if err := stream.Send(req); err != nil {
			return sent, fmt.Errorf("send %T: %w", req.GetMsg(), err)
		}
	}
	return sent, nil
}
