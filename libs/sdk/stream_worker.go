package flo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults of [StreamWorkerOptions].
const (
	DefaultGroup          = "default"
	DefaultBatchSize      = 10
	DefaultMessageTimeout = 5 * time.Minute
)

const (
	// createGroupTimeout bounds the call that makes sure the worker's group exists.
	createGroupTimeout = 10 * time.Second
	// maxReads is how many reads a stream worker keeps outstanding at most; the gateway
	// accepts up to four per stream and group.
	maxReads = 2
	// ackDelay is how long acks and nacks may wait while handlers still run, so that the
	// records of a batch, which finish about together, are settled in a few messages instead
	// of one or two each.
	ackDelay = 2 * time.Millisecond
)

// StreamWorkerOptions configure a [StreamWorker]. Zero fields take the defaults.
type StreamWorkerOptions struct {
	// Stream is the stream to consume; it must exist. Required.
	Stream string
	// Group is the consumer group the worker reads as (default "default"). It is created,
	// reading from the stream's first record, if it does not exist yet.
	Group string
	// GroupMode is the mode the group is created with (see GroupOptions.Mode; default
	// GroupShared). A group that exists with another mode makes Run fail.
	GroupMode string
	// Consumer names the worker within its group, in pending lists (default: the worker id).
	Consumer string
	// WorkerID identifies the worker to the server; the default is the host name and eight
	// random hex digits, so restarts and replicas never collide.
	WorkerID string
	// MachineID groups workers running on one host; the default is the host name.
	MachineID string
	// Concurrency is how many records are handled at once (default 10).
	Concurrency int
	// BatchSize is the most records one read asks for (default 10); a read never asks for
	// more than there are free handler slots. With a read outstanding, the worker sends a
	// second one when a whole batch fits beside it, so with Concurrency at least twice
	// BatchSize the next batch is on its way while the last one is handled.
	BatchSize int
	// BlockMS is how long the server may hold a read open before answering that there is
	// nothing new (default 300000, five minutes).
	BlockMS int64
	// MessageTimeout bounds the handling of one record (default 5 minutes): the handler's
	// context ends then and the record is nacked. The group redelivers a record its consumer
	// has held this long without settling it, so a worker that dies loses nothing.
	MessageTimeout time.Duration
	// HeartbeatInterval is how often the worker tells the registry it is alive and how many
	// records it is handling (default 30 s).
	HeartbeatInterval time.Duration
	// Metadata is recorded with the worker in the registry as a JSON object: labels, version,
	// environment. It must encode as JSON.
	Metadata map[string]any
	// Logger receives connection changes and handler panics; the default is slog.Default().
	Logger *slog.Logger
}

// StreamWorker consumes a stream as one consumer of a consumer group: it reads batches of
// records over the worker stream, runs the handler for each record in its own goroutine, and
// acks the record when the handler returns nil or nacks it, for redelivery to the group, when
// the handler returns an error, panics or runs past MessageTimeout.
type StreamWorker struct {
	lifecycle
	opts    StreamWorkerOptions
	handler func(*StreamContext) error
	// spanAttrs are the attributes every record's span shares.
	spanAttrs []attribute.KeyValue
}

// NewStreamWorker returns a worker that consumes opts.Stream through this client's connection
// and namespace, calling handler for every record. Call it after [Client.Connect].
func (c *Client) NewStreamWorker(opts StreamWorkerOptions, handler func(*StreamContext) error) (*StreamWorker, error) {
	if opts.Stream == "" {
		return nil, errors.New("flo: stream worker: Stream is required")
	}
	if handler == nil {
		return nil, errors.New("flo: stream worker: handler is nil")
	}
	if opts.Concurrency < 0 || opts.BatchSize < 0 || opts.BlockMS < 0 || opts.MessageTimeout < 0 || opts.HeartbeatInterval < 0 {
		return nil, errors.New("flo: stream worker options must not be negative")
	}
	opts.WorkerID, opts.MachineID = workerIdentity(opts.WorkerID, opts.MachineID)
	if opts.Group == "" {
		opts.Group = DefaultGroup
	}
	if opts.Consumer == "" {
		opts.Consumer = opts.WorkerID
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.BlockMS == 0 {
		opts.BlockMS = DefaultBlockMS
	}
	if opts.MessageTimeout == 0 {
		opts.MessageTimeout = DefaultMessageTimeout
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	w := &StreamWorker{opts: opts, handler: handler, spanAttrs: []attribute.KeyValue{
		attribute.String("flo.stream", opts.Stream),
		attribute.String("flo.stream.group", opts.Group),
		attribute.String("flo.stream.consumer", opts.Consumer),
		attribute.String("flo.namespace", c.namespace),
		attribute.String("flo.worker.id", opts.WorkerID),
	}}
	err := w.setup(c, w, workerSettings{
		workerID:          opts.WorkerID,
		machineID:         opts.MachineID,
		concurrency:       opts.Concurrency,
		heartbeatInterval: opts.HeartbeatInterval,
		handlerTimeout:    opts.MessageTimeout,
		reportDelay:       ackDelay,
		metadata:          opts.Metadata,
		logger:            opts.Logger,
	}, "stream", opts.Stream, "group", opts.Group)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Options returns the worker's options with defaults filled in.
func (w *StreamWorker) Options() StreamWorkerOptions { return w.opts }

// ID returns the worker's id, the one it registers and is listed, drained and deregistered
// under.
func (w *StreamWorker) ID() string { return w.opts.WorkerID }

// Start registers the worker in the worker registry (as a stream worker with the process
// "stream/group"), creates its group if the stream has none of that name, connects to the
// server and handles records until ctx ends, Close is called or the worker is drained. It
// then stops reading, lets the running handlers finish (waiting at most MessageTimeout),
// sends their acks and nacks, closes the stream, removes the worker from the registry and
// returns nil. Heartbeats, reconnects and the registry being unreachable are handled as for
// [ActionWorker.Start]. Start returns an error only when it cannot run at all: a closed worker
// or client, a registration the registry refuses, a stream that does not exist, or a server
// that refuses the worker (bad token, unknown namespace).
func (w *StreamWorker) Start(ctx context.Context) error { return w.run(ctx) }

// Close stops a running worker the way the end of Start's context does and waits for Start to
// return. Closing a worker that never started, or closing twice, does nothing more.
func (w *StreamWorker) Close() error { return w.close() }

func (w *StreamWorker) check() error { return nil }

func (w *StreamWorker) registration() (flov1.WorkerType, []*flov1.WorkerProcess) {
	return flov1.WorkerType_WORKER_TYPE_STREAM, []*flov1.WorkerProcess{{
		Name: w.opts.Stream + "/" + w.opts.Group,
		Kind: flov1.ProcessKind_PROCESS_KIND_STREAM_CONSUMER,
	}}
}

// prepare creates the worker's group, from the stream's first record, unless it exists: the
// first worker of a new group then sees everything the stream holds, and later ones join it.
func (w *StreamWorker) prepare(ctx context.Context) error {
	svc, err := w.client.streamService()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, createGroupTimeout)
	defer cancel()
	_, err = svc.CreateGroup(ctx, &flov1.CreateGroupRequest{
		Namespace: w.client.namespace,
		Stream:    w.opts.Stream,
		Name:      w.opts.Group,
		Start:     "-",
		Mode:      w.opts.GroupMode,
	})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("create group %s of stream %s: %w", w.opts.Group, w.opts.Stream, err)
	}
	return nil
}

func (w *StreamWorker) hello(h *flov1.Hello) {
	h.Streams = []*flov1.StreamSubscription{{Stream: w.opts.Stream, Group: w.opts.Group, Consumer: w.opts.Consumer}}
}

// receive starts the records of a batch as slots allow.
func (w *StreamWorker) receive(ctx context.Context, msg *flov1.ServerMessage) error {
	batch := msg.GetRecordBatch()
	if batch == nil {
		return nil
	}
	records := batch.GetRecords()
	// The batch answers one outstanding read; until its records have slots, no further read.
	w.slots.answer(len(records))
	for _, rec := range records {
		if err := w.startRecord(ctx, rec); err != nil {
			return err
		}
	}
	// Now the next read may go out, for the slots these records left free.
	poke(w.wake)
	return nil
}

// startRecord takes a slot for rec and handles it. A stopping worker hands new records
// straight back to the group.
func (w *StreamWorker) startRecord(ctx context.Context, rec *flov1.StreamRecord) error {
	ok, err := w.takeSlot(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return w.enqueue(ctx, w.nack(rec.GetId(), 0, "the worker is stopping"))
	}
	w.dispatch(func() *flov1.WorkerMessage { return w.process(rec) })
	return nil
}

// process runs the handler for rec inside its trace span and returns the ack or nack that
// settles it; nil when the message timeout settled it first.
func (w *StreamWorker) process(rec *flov1.StreamRecord) *flov1.WorkerMessage {
	ctx, span := tracer.Start(w.parent(rec.GetTraceContext()), "flo.stream "+w.opts.Stream, trace.WithSpanKind(trace.SpanKindConsumer))
	defer span.End()
	// As an action's span (handler.go): built only for a span that records.
	if span.IsRecording() {
		span.SetAttributes(w.spanAttrs...)
		span.SetAttributes(
			attribute.String("flo.record.id", rec.GetId()),
			attribute.Int("flo.record.delivery_count", int(rec.GetDeliveryCount())),
		)
	}
	ctx, cancel := context.WithTimeout(ctx, w.opts.MessageTimeout)
	defer cancel()

	// A record is settled once: by the handler's return or, if the handler is still running
	// when its time is up, by a nack then, so the group can hand it to a consumer that is not
	// stuck. The handler keeps its slot until it returns.
	var settled atomic.Bool
	timedOut := make(chan struct{})
	stopTimer := context.AfterFunc(ctx, func() {
		defer close(timedOut)
		if settled.CompareAndSwap(false, true) {
			reason := fmt.Sprintf("message timeout: the handler ran longer than %s", w.opts.MessageTimeout)
			span.SetStatus(otelcodes.Error, reason)
			w.queue(w.nack(rec.GetId(), 0, reason))
		}
	})

	err := callStreamHandler(w.handler, newStreamContext(ctx, w, rec))
	if !stopTimer() {
		<-timedOut // the timeout fired: its nack is queued before the slot is freed
	}
	if !settled.CompareAndSwap(false, true) {
		return nil
	}
	if err == nil {
		return w.ack(rec.GetId())
	}
	var p *panicError
	if errors.As(err, &p) {
		w.log.Error("flo: stream handler panicked", "record_id", rec.GetId(),
			"panic", fmt.Sprint(p.value), "stack", string(p.stack))
	}
	span.RecordError(err)
	span.SetStatus(otelcodes.Error, err.Error())
	var delay time.Duration
	var nack *NackError
	if errors.As(err, &nack) {
		delay = max(nack.Delay, 0)
	}
	return w.nack(rec.GetId(), delay, wireText(err.Error()))
}

// callStreamHandler runs h, turning a panic into an error so one bad record cannot take the
// worker down.
func callStreamHandler(h func(*StreamContext) error, sctx *StreamContext) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{value: r, stack: debug.Stack()}
		}
	}()
	return h(sctx)
}

func (w *StreamWorker) ack(id string) *flov1.WorkerMessage {
	return &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamAck{StreamAck: &flov1.StreamAck{
		Stream: w.opts.Stream, Group: w.opts.Group, Ids: []string{id},
	}}}
}

func (w *StreamWorker) nack(id string, delay time.Duration, reason string) *flov1.WorkerMessage {
	return &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamNack{StreamNack: &flov1.StreamNack{
		Stream: w.opts.Stream, Group: w.opts.Group, Ids: []string{id}, DelayMs: delay.Milliseconds(), Reason: reason,
	}}}
}

// pack coalesces acks into one StreamAck per stream and group, and nacks into one StreamNack
// per stream, group, delay and reason, in the order each first appeared.
func (w *StreamWorker) pack(queued []*flov1.WorkerMessage) []*flov1.WorkerMessage {
	type ackKey struct{ stream, group string }
	type nackKey struct {
		stream, group, reason string
		delay                 int64
	}
	msgs := make([]*flov1.WorkerMessage, 0, 2)
	acks := map[ackKey]*flov1.StreamAck{}
	nacks := map[nackKey]*flov1.StreamNack{}
	for _, msg := range queued {
		switch m := msg.GetMsg().(type) {
		case *flov1.WorkerMessage_StreamAck:
			k := ackKey{m.StreamAck.GetStream(), m.StreamAck.GetGroup()}
			if a, ok := acks[k]; ok {
				a.Ids = append(a.Ids, m.StreamAck.GetIds()...)
				continue
			}
			a := &flov1.StreamAck{Stream: k.stream, Group: k.group, Ids: append([]string(nil), m.StreamAck.GetIds()...)}
			acks[k] = a
			msgs = append(msgs, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamAck{StreamAck: a}})
		case *flov1.WorkerMessage_StreamNack:
			n := m.StreamNack
			k := nackKey{n.GetStream(), n.GetGroup(), n.GetReason(), n.GetDelayMs()}
			if c, ok := nacks[k]; ok {
				c.Ids = append(c.Ids, n.GetIds()...)
				continue
			}
			c := &flov1.StreamNack{Stream: k.stream, Group: k.group, Ids: append([]string(nil), n.GetIds()...), DelayMs: k.delay, Reason: k.reason}
			nacks[k] = c
			msgs = append(msgs, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamNack{StreamNack: c}})
		default:
			msgs = append(msgs, msg)
		}
	}
	return msgs
}

// request asks for a batch of at most BatchSize records, no more than there are free slots.
// While reads are outstanding it asks for another only if a whole batch fits, up to
// maxReads reads, so the next batch is on its way while the last is handled.
func (w *StreamWorker) request() *flov1.WorkerMessage {
	n := w.slots.grantRead(w.opts.BatchSize, maxReads)
	if n == 0 {
		return nil
	}
	// The writer sends one request each time it wakes; wake it for the next read.
	poke(w.wake)
	return &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamRead{StreamRead: &flov1.StreamRead{
		Stream:           w.opts.Stream,
		Group:            w.opts.Group,
		Consumer:         w.opts.Consumer,
		Count:            int32(n),
		BlockMs:          w.opts.BlockMS,
		MessageTimeoutMs: w.opts.MessageTimeout.Milliseconds(),
	}}}
}

func (w *StreamWorker) streamEnded() {}
