package flo_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// These tests hold the stream worker to the worker stream's protocol for records, with the
// scripted peer of worker_test.go playing the gateway.

// nextRead requires the next message to be a StreamRead and returns it.
func (ps *peerStream) nextRead() *flov1.StreamRead {
	ps.t.Helper()
	msg := ps.next()
	require.NotNil(ps.t, msg.GetStreamRead(), "want StreamRead, got %v", msg)
	return msg.GetStreamRead()
}

func (ps *peerStream) sendRecords(records ...*flov1.StreamRecord) {
	ps.t.Helper()
	ps.send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_RecordBatch{RecordBatch: &flov1.RecordBatch{
		Stream: "events", Group: "processors", Records: records,
	}}})
}

// settlement is what a worker said about records: the ids it acked, its nacks by id, and the
// reads it sent on the way.
type settlement struct {
	acks  []string
	nacks map[string]*flov1.StreamNack
	reads []*flov1.StreamRead
}

func (s *settlement) add(msg *flov1.WorkerMessage) bool {
	switch m := msg.GetMsg().(type) {
	case *flov1.WorkerMessage_StreamAck:
		s.acks = append(s.acks, m.StreamAck.GetIds()...)
	case *flov1.WorkerMessage_StreamNack:
		for _, id := range m.StreamNack.GetIds() {
			s.nacks[id] = m.StreamNack
		}
	case *flov1.WorkerMessage_StreamRead:
		s.reads = append(s.reads, m.StreamRead)
	default:
		return false
	}
	return true
}

// settled collects acks and nacks until n records are settled.
func (ps *peerStream) settled(n int) *settlement {
	ps.t.Helper()
	s := &settlement{nacks: map[string]*flov1.StreamNack{}}
	for len(s.acks)+len(s.nacks) < n {
		msg := ps.next()
		require.True(ps.t, s.add(msg), "want acks, nacks or reads, got %v", msg)
	}
	return s
}

// closedSettlement collects everything until the worker closes its stream.
func (ps *peerStream) closedSettlement() *settlement {
	ps.t.Helper()
	s := &settlement{nacks: map[string]*flov1.StreamNack{}}
	for _, msg := range ps.untilClosed() {
		require.True(ps.t, s.add(msg), "want acks, nacks or reads, got %v", msg)
	}
	return s
}

// firstRead runs w on p and returns its stream once it has sent its first read.
func firstRead(t *testing.T, p *peer, w *flo.StreamWorker) *peerStream {
	t.Helper()
	runStreamWorker(t, w)
	ps := p.accept(t)
	ps.handshake()
	ps.nextRead()
	return ps
}

func record(id, payload string) *flov1.StreamRecord {
	return &flov1.StreamRecord{Id: id, Payload: []byte(payload), DeliveryCount: 1}
}

// runStreamWorker starts w and returns a function that stops it and returns what Start
// returned.
func runStreamWorker(t *testing.T, w *flo.StreamWorker) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(waitFor):
				t.Fatal("Start did not return after its context ended")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func TestStreamWorkerRegistersCreatesItsGroupAndSettlesRecords(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	type seen struct {
		id, stream, group, consumer, namespace, key string
		headers                                     map[string]string
		deliveries                                  int
		appendedAt                                  time.Time
		event                                       map[string]any
		hasDeadline                                 bool
	}
	seenc := make(chan seen, 1)
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{
		Stream: "events", Group: "processors", WorkerID: "sw-1", MachineID: "m-1",
		Concurrency: 5, BatchSize: 10, BlockMS: 250, MessageTimeout: 2 * time.Second,
		Metadata: map[string]any{"version": "1.0"}, Logger: quietLogger(),
	}, func(sctx *flo.StreamContext) error {
		var event map[string]any
		if err := sctx.Into(&event); err != nil {
			return err
		}
		switch event["type"] {
		case "fail":
			return errors.New("db down")
		case "panic":
			panic("boom")
		case "inspect":
			_, hasDeadline := sctx.Context().Deadline()
			seenc <- seen{
				id: sctx.StreamID(), stream: sctx.Stream(), group: sctx.Group(), consumer: sctx.Consumer(),
				namespace: sctx.Namespace(), key: sctx.Key(), headers: sctx.Headers(), deliveries: sctx.DeliveryCount(),
				appendedAt: sctx.AppendedAt(), event: event, hasDeadline: hasDeadline,
			}
		}
		return nil
	})
	require.NoError(t, err)
	stop := runStreamWorker(t, w)

	ps := p.accept(t)
	require.Equal(t, []string{"register sw-1", "create-group myapp/events/processors from -", "stream"}, p.registry.calls()[:3],
		"registered, then created its group from the first record, then opened the stream")
	reg := p.registry.registration("sw-1")
	require.Equal(t, flov1.WorkerType_WORKER_TYPE_STREAM, reg.GetWorkerType())
	require.Equal(t, int32(5), reg.GetMaxConcurrency())
	require.Equal(t, "m-1", reg.GetMachineId())
	require.JSONEq(t, `{"version":"1.0"}`, reg.GetMetadata())
	require.Len(t, reg.GetProcesses(), 1)
	require.Equal(t, "events/processors", reg.GetProcesses()[0].GetName())
	require.Equal(t, flov1.ProcessKind_PROCESS_KIND_STREAM_CONSUMER, reg.GetProcesses()[0].GetKind())

	hello := ps.handshake()
	require.Equal(t, "sw-1", hello.GetWorkerId())
	require.Equal(t, "myapp", hello.GetNamespace())
	require.Equal(t, "secret", hello.GetToken())
	require.Empty(t, hello.GetActions())
	require.Equal(t, int32(5), hello.GetMaxConcurrency())
	require.Len(t, hello.GetStreams(), 1)
	sub := hello.GetStreams()[0]
	require.Equal(t, []string{"events", "processors", "sw-1"}, []string{sub.GetStream(), sub.GetGroup(), sub.GetConsumer()})

	read := ps.nextRead()
	require.Equal(t, "events", read.GetStream())
	require.Equal(t, "processors", read.GetGroup())
	require.Equal(t, "sw-1", read.GetConsumer())
	require.Equal(t, int32(5), read.GetCount(), "no more than the free slots, though BatchSize is 10")
	require.Equal(t, int64(250), read.GetBlockMs())
	require.Equal(t, int64(2000), read.GetMessageTimeoutMs())

	inspect := &flov1.StreamRecord{
		Id: "1767323045000-3", Payload: []byte(`{"type":"inspect"}`), Headers: map[string]string{"source": "web"},
		Key: "user-1", DeliveryCount: 3, AppendedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
	}
	ps.sendRecords(record("1767323045000-0", `{"type":"ok"}`), record("1767323045000-1", `{"type":"fail"}`),
		record("1767323045000-2", `{"type":"panic"}`), inspect, record("1767323045000-4", `not json`))
	s := ps.settled(5)
	slices.Sort(s.acks)
	require.Equal(t, []string{"1767323045000-0", "1767323045000-3"}, s.acks)
	require.Len(t, s.nacks, 3)
	for id, reason := range map[string]string{"1767323045000-1": "db down", "1767323045000-2": "panic: boom"} {
		require.Equal(t, reason, s.nacks[id].GetReason(), id)
		require.Zero(t, s.nacks[id].GetDelayMs(), "nacked for redelivery at once")
		require.Equal(t, "events", s.nacks[id].GetStream())
		require.Equal(t, "processors", s.nacks[id].GetGroup())
	}
	require.Contains(t, s.nacks["1767323045000-4"].GetReason(), "decode payload of record 1767323045000-4")
	require.LessOrEqual(t, len(s.reads), 1, "one read at a time")

	got := <-seenc
	require.Equal(t, seen{
		id: "1767323045000-3", stream: "events", group: "processors", consumer: "sw-1", namespace: "myapp",
		key: "user-1", headers: map[string]string{"source": "web"}, deliveries: 3,
		appendedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), event: map[string]any{"type": "inspect"}, hasDeadline: true,
	}, got)

	require.NoError(t, stop())
	calls := p.registry.calls()
	require.Equal(t, "deregister sw-1", calls[len(calls)-1])
}

func TestStreamWorkerJoinsAnExistingGroup(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	p.streamSvc.addGroup("events", "default")
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{Stream: "events", GroupMode: flo.GroupKeyShared, WorkerID: "sw-j", Consumer: "c-7", Logger: quietLogger()},
		func(*flo.StreamContext) error { return nil })
	require.NoError(t, err)
	runStreamWorker(t, w)
	ps := p.accept(t)
	sub := ps.handshake().GetStreams()[0]
	require.Equal(t, []string{"events", "default", "c-7"}, []string{sub.GetStream(), sub.GetGroup(), sub.GetConsumer()})
	require.Equal(t, "create-group myapp/events/default from - mode key_shared", p.registry.calls()[1], "the group is asked for with its mode")
	require.Equal(t, "events/default", p.registry.registration("sw-j").GetProcesses()[0].GetName())
	require.Equal(t, int32(10), ps.nextRead().GetCount(), "the AlreadyExists answer is no obstacle")
}

// holdingStreamWorker runs a stream worker of concurrency slots and batchSize whose handlers
// report each record's id on running and return nil once release is closed. It returns the
// worker's stream, past the handshake, and a function that stops the worker.
func holdingStreamWorker(t *testing.T, concurrency, batchSize int) (ps *peerStream, running <-chan string, release chan struct{}, stop func() error) {
	t.Helper()
	p, client := startPeer(t)
	release = make(chan struct{})
	started := make(chan string, 8)
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{
		Stream: "events", Group: "processors", Concurrency: concurrency, BatchSize: batchSize, Logger: quietLogger(),
	}, func(sctx *flo.StreamContext) error {
		started <- sctx.StreamID()
		<-release
		return nil
	})
	require.NoError(t, err)
	stop = runStreamWorker(t, w)
	ps = p.accept(t)
	ps.handshake()
	return ps, started, release, stop
}

func TestStreamWorkerKeepsOneReadOutstanding(t *testing.T) {
	t.Parallel()
	ps, running, release, stop := holdingStreamWorker(t, 4, 3)
	require.Equal(t, int32(3), ps.nextRead().GetCount(), "BatchSize bounds a read")
	// Fewer records than asked for: the read is answered, and the next asks for what is free.
	ps.sendRecords(record("1-0", `{}`), record("1-1", `{}`))
	<-running
	<-running
	require.Equal(t, int32(2), ps.nextRead().GetCount(), "two slots busy, two free")

	// That read is outstanding: handlers finishing are acked, and no further read goes out.
	close(release)
	s := ps.settled(2)
	require.ElementsMatch(t, []string{"1-0", "1-1"}, s.acks)
	require.Empty(t, s.reads)
	// An empty answer (the block time passed) frees the read: the next asks for every slot,
	// up to BatchSize.
	ps.sendRecords()
	require.Equal(t, int32(3), ps.nextRead().GetCount())

	// A server sending more than was asked for still gets at most Concurrency handlers.
	ps.sendRecords(record("2-0", `{}`), record("2-1", `{}`), record("2-2", `{}`), record("2-3", `{}`), record("2-4", `{}`))
	s = ps.settled(5)
	require.Len(t, s.acks, 5)

	require.NoError(t, stop())
	rest := ps.closedSettlement()
	// The reads still unanswered never promise more records than there are slots. Which reads
	// went out depends on how many handlers were still busy when the batch's last record took
	// a slot: one read, or a small one and then a whole batch beside it.
	unanswered := append(s.reads, rest.reads...)
	require.LessOrEqual(t, len(unanswered), 2, "at most two reads outstanding")
	var promised int32
	for _, r := range unanswered {
		promised += r.GetCount()
	}
	require.LessOrEqual(t, promised, int32(4), "the unanswered reads fit the four slots")
}

func TestStreamWorkerPipelinesReads(t *testing.T) {
	t.Parallel()
	ps, running, release, stop := holdingStreamWorker(t, 7, 3)
	require.Equal(t, int32(3), ps.nextRead().GetCount())
	require.Equal(t, int32(3), ps.nextRead().GetCount(), "a second whole batch fits: it is asked for before the first arrives")

	// Three handlers busy and three records promised: one slot free, less than a batch.
	ps.sendRecords(record("1-0", `{}`), record("1-1", `{}`), record("1-2", `{}`))
	for range 3 {
		<-running
	}
	close(release)
	s := ps.settled(3)
	require.ElementsMatch(t, []string{"1-0", "1-1", "1-2"}, s.acks)
	reads := s.reads
	if len(reads) == 0 {
		reads = append(reads, ps.nextRead())
	}
	require.Len(t, reads, 1, "the handlers' slots make room for one more batch beside the outstanding read")
	require.Equal(t, int32(3), reads[0].GetCount())

	// Both outstanding reads answered empty: two reads go out again.
	ps.sendRecords()
	ps.sendRecords()
	require.Equal(t, int32(3), ps.nextRead().GetCount())
	require.Equal(t, int32(3), ps.nextRead().GetCount())

	require.NoError(t, stop())
	rest := ps.closedSettlement()
	require.Empty(t, rest.reads, "at most two reads outstanding")
}

// Acks wait a moment while handlers still run, to go out together, but a handler that keeps
// running holds back no one else's ack.
func TestStreamWorkerAcksWhileAHandlerKeepsRunning(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	stuck := make(chan struct{})
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{Stream: "events", Group: "processors", Logger: quietLogger()},
		func(sctx *flo.StreamContext) error {
			if sctx.StreamID() == "1-0" {
				<-stuck
			}
			return nil
		})
	require.NoError(t, err)
	ps := firstRead(t, p, w)
	ps.sendRecords(record("1-0", `{}`), record("1-1", `{}`), record("1-2", `{}`))
	s := ps.settled(2)
	require.ElementsMatch(t, []string{"1-1", "1-2"}, s.acks)
	close(stuck)
	require.Equal(t, []string{"1-0"}, ps.settled(1).acks)
}

func TestStreamWorkerNacksWhenTheMessageTimeoutPasses(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	ctxErr := make(chan error, 1)
	release := make(chan struct{})
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{
		Stream: "events", Group: "processors", MessageTimeout: 20 * time.Millisecond, Logger: quietLogger(),
	}, func(sctx *flo.StreamContext) error {
		<-sctx.Context().Done()
		ctxErr <- sctx.Context().Err()
		<-release // a handler that does not stop when told
		return nil
	})
	require.NoError(t, err)
	stop := runStreamWorker(t, w)

	ps := p.accept(t)
	ps.handshake()
	require.Equal(t, int64(20), ps.nextRead().GetMessageTimeoutMs())
	ps.sendRecords(record("1-0", `{}`))
	s := ps.settled(1)
	require.Empty(t, s.acks)
	require.Contains(t, s.nacks["1-0"].GetReason(), "message timeout")
	require.Zero(t, s.nacks["1-0"].GetDelayMs())
	require.ErrorIs(t, <-ctxErr, context.DeadlineExceeded, "the handler's context ended")

	// The handler returning nil later settles nothing more: the record was nacked.
	close(release)
	require.NoError(t, stop())
	rest := ps.closedSettlement()
	require.Empty(t, rest.acks)
	require.Empty(t, rest.nacks)
}

func TestStreamWorkerUsesTheDelayOfANackError(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{Stream: "events", Group: "processors", Logger: quietLogger()},
		func(*flo.StreamContext) error { return flo.NewNackErrorf(3*time.Second, "rate limited") })
	require.NoError(t, err)
	ps := firstRead(t, p, w)
	ps.sendRecords(record("1-0", `{}`))
	nack := ps.settled(1).nacks["1-0"]
	require.Equal(t, int64(3000), nack.GetDelayMs())
	require.Equal(t, "rate limited", nack.GetReason())
}

func TestStreamWorkerDrainsOnTheStreamsDrainMessage(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	started := make(chan struct{})
	release := make(chan struct{})
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{
		Stream: "events", Group: "processors", WorkerID: "sw-d", Concurrency: 2, HeartbeatInterval: time.Hour, Logger: quietLogger(),
	}, func(sctx *flo.StreamContext) error {
		if sctx.StreamID() == "1-0" {
			close(started)
			<-release
		}
		return nil
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- w.Start(context.Background()) }()

	ps := p.accept(t)
	ps.handshake()
	require.Equal(t, int32(2), ps.nextRead().GetCount())
	ps.sendRecords(record("1-0", `{}`))
	<-started
	require.Equal(t, int32(1), ps.nextRead().GetCount())

	ps.send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_Drain{Drain: &flov1.Drain{}}})
	// A record answering the outstanding read after the drain is handed straight back.
	ps.sendRecords(record("2-0", `{}`))
	s := ps.settled(1)
	require.Equal(t, "the worker is stopping", s.nacks["2-0"].GetReason())
	require.Zero(t, s.nacks["2-0"].GetDelayMs())
	select {
	case err := <-done:
		t.Fatalf("Start returned %v while a record was being handled", err)
	case <-time.After(20 * time.Millisecond):
	}

	close(release)
	rest := ps.closedSettlement()
	require.Equal(t, []string{"1-0"}, rest.acks, "the running handler finished and was acked")
	require.Empty(t, rest.reads, "a draining worker reads nothing")
	require.Empty(t, s.reads)
	require.NoError(t, requireReturns(t, done))
	calls := p.registry.calls()
	require.Equal(t, "deregister sw-d", calls[len(calls)-1])
}

func TestStreamWorkerDrainsWhenTheHeartbeatSaysDraining(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{
		Stream: "events", WorkerID: "sw-h", HeartbeatInterval: 10 * time.Millisecond, Logger: quietLogger(),
	}, func(*flo.StreamContext) error { return nil })
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- w.Start(context.Background()) }()
	ps := p.accept(t)
	ps.handshake()
	ps.nextRead()
	p.registry.drain("sw-h")
	require.Empty(t, ps.closedSettlement().reads)
	require.NoError(t, requireReturns(t, done))
	calls := p.registry.calls()
	require.Equal(t, "deregister sw-h", calls[len(calls)-1])
}

func TestStreamWorkerReconnectsAndSettlesOnTheNewStream(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	started := make(chan struct{})
	release := make(chan struct{})
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{
		Stream: "events", Group: "processors", Concurrency: 3, Logger: quietLogger(),
	}, func(*flo.StreamContext) error {
		close(started)
		<-release
		return nil
	})
	require.NoError(t, err)
	runStreamWorker(t, w)

	first := p.accept(t)
	first.handshake()
	first.nextRead()
	first.sendRecords(record("1-0", `{}`))
	<-started
	first.nextRead()
	first.end <- status.Error(codes.Unavailable, "gateway restarting")

	second := p.accept(t)
	second.handshake()
	require.Equal(t, int32(2), second.nextRead().GetCount(), "the read died with its stream; the running record keeps its slot")
	close(release)
	require.Equal(t, []string{"1-0"}, second.settled(1).acks, "the handler outlived its stream and its ack went out on the new one")
	require.Equal(t, 1, p.registry.count("create-group myapp/events/processors from -"), "the group is made once")
}

func TestStreamWorkerStartFailsForAStreamThatDoesNotExist(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	p.streamSvc.setCreateGroupErr(status.Error(codes.NotFound, `stream "events" not found`))
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{Stream: "events", WorkerID: "sw-x", Logger: quietLogger()},
		func(*flo.StreamContext) error { return nil })
	require.NoError(t, err)
	err = requireReturns(t, startStreamWorker(t, w))
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "create group default of stream events")
	require.NotContains(t, p.registry.calls(), "stream", "no stream opened")
	calls := p.registry.calls()
	require.Equal(t, "deregister sw-x", calls[len(calls)-1])
}

func TestStreamWorkerRetriesAGroupCallTheServerCouldNotAnswer(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	p.streamSvc.setCreateGroupErr(status.Error(codes.Unavailable, "streams service not configured"))
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{Stream: "events", Logger: quietLogger()},
		func(*flo.StreamContext) error { return nil })
	require.NoError(t, err)
	runStreamWorker(t, w)
	require.Eventually(t, func() bool { return p.registry.count("create-group myapp/events/default from -") >= 2 }, waitFor, time.Millisecond)
	p.streamSvc.setCreateGroupErr(nil)
	ps := p.accept(t)
	ps.handshake()
	ps.nextRead()
}

func TestStreamWorkerStopsWhenTheServerRefusesTheGroup(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{Stream: "events", Logger: quietLogger()},
		func(*flo.StreamContext) error { return nil })
	require.NoError(t, err)
	done := startStreamWorker(t, w)
	ps := p.accept(t)
	ps.handshake()
	ps.nextRead()
	// The group was deleted while the worker read it.
	ps.end <- status.Error(codes.NotFound, `group "default" of stream "events" not found`)
	require.Equal(t, codes.NotFound, status.Code(requireReturns(t, done)))
}

func startStreamWorker(t *testing.T, w *flo.StreamWorker) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	return done
}

func TestStreamWorkerContinuesTraceOfTheAppend(t *testing.T) {
	// Not parallel: it installs the global propagator.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator()) })

	p, client := startPeer(t)
	type seen struct{ id, trace string }
	spans := make(chan seen, 3)
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{Stream: "events", Logger: quietLogger()},
		func(sctx *flo.StreamContext) error {
			spans <- seen{sctx.StreamID(), trace.SpanContextFromContext(sctx.Context()).TraceID().String()}
			return nil
		})
	require.NoError(t, err)
	ps := firstRead(t, p, w)
	// Records of one append share its trace context; each record continues the trace it
	// carries.
	const first, second = "4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c"
	var recs []*flov1.StreamRecord
	for i, traceID := range []string{first, first, second} {
		rec := record(fmt.Sprintf("1-%d", i), `{}`)
		rec.TraceContext = map[string]string{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}
		recs = append(recs, rec)
	}
	ps.sendRecords(recs...)
	got := map[string]string{}
	for range recs {
		sc := <-spans
		got[sc.id] = sc.trace
	}
	require.Equal(t, map[string]string{"1-0": first, "1-1": first, "1-2": second}, got)
}

func TestStreamWorkerOptions(t *testing.T) {
	t.Parallel()
	client := flo.NewClient("127.0.0.1:1")
	handler := func(*flo.StreamContext) error { return nil }
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{Stream: "events"}, handler)
	require.NoError(t, err)
	opts := w.Options()
	require.Equal(t, "default", opts.Group)
	require.Regexp(t, `^.+-[0-9a-f]{8}$`, opts.WorkerID)
	require.Equal(t, opts.WorkerID, opts.Consumer, "the consumer defaults to the worker id")
	require.Equal(t, opts.WorkerID, w.ID())
	require.NotEmpty(t, opts.MachineID)
	require.Equal(t, 10, opts.Concurrency)
	require.Equal(t, 10, opts.BatchSize)
	require.Equal(t, int64(300000), opts.BlockMS)
	require.Equal(t, 5*time.Minute, opts.MessageTimeout)
	require.Equal(t, 30*time.Second, opts.HeartbeatInterval)
	require.ErrorIs(t, w.Start(context.Background()), flo.ErrNotConnected)
	require.NoError(t, w.Close())
	require.ErrorIs(t, w.Start(context.Background()), flo.ErrWorkerClosed)

	tests := []struct {
		name    string
		opts    flo.StreamWorkerOptions
		handler func(*flo.StreamContext) error
		wantErr string
	}{
		{name: "no stream", opts: flo.StreamWorkerOptions{}, handler: handler, wantErr: "Stream is required"},
		{name: "no handler", opts: flo.StreamWorkerOptions{Stream: "events"}, wantErr: "handler is nil"},
		{name: "negative concurrency", opts: flo.StreamWorkerOptions{Stream: "events", Concurrency: -1}, handler: handler, wantErr: "must not be negative"},
		{name: "negative batch size", opts: flo.StreamWorkerOptions{Stream: "events", BatchSize: -1}, handler: handler, wantErr: "must not be negative"},
		{name: "negative message timeout", opts: flo.StreamWorkerOptions{Stream: "events", MessageTimeout: -time.Second}, handler: handler, wantErr: "must not be negative"},
		{name: "metadata that is not JSON", opts: flo.StreamWorkerOptions{Stream: "events", Metadata: map[string]any{"f": func() {}}}, handler: handler, wantErr: "worker metadata"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client.NewStreamWorker(tt.opts, tt.handler)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestStreamWorkerHeartbeatsItsLoad(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	release := make(chan struct{})
	w, err := client.NewStreamWorker(flo.StreamWorkerOptions{
		Stream: "events", WorkerID: "sw-l", HeartbeatInterval: 10 * time.Millisecond, Logger: quietLogger(),
	}, func(*flo.StreamContext) error {
		<-release
		return nil
	})
	require.NoError(t, err)
	ps := firstRead(t, p, w)
	ps.sendRecords(record("1-0", `{}`), record("1-1", `{}`), record("1-2", `{}`))
	require.Eventually(t, func() bool { return slices.Contains(p.registry.loads(), 3) }, waitFor, time.Millisecond,
		"no heartbeat carried the three running handlers")
	close(release)
	ps.settled(3)
}
