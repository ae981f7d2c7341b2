// Package trigger runs workflows' stream triggers. Every replica of the
// workflow service runs a Manager, which keeps one reader per enabled
// workflow whose latest version has a trigger, refreshing that set from the
// catalog every few seconds: a workflow created, disabled, enabled or given a
// new version on any replica is picked up at the next refresh.
//
// A reader reads its stream through a consumer group of the streams service
// (creating the group, from the stream's first record, when it is missing),
// starts one run per record or per batch of batch_size records, and acks the
// records only after the run's start committed. The start records each
// record's run in the same transaction, so a record handed out again — after
// a crash between the start and the ack, after its message timeout, or in
// another batch — finds the run it already started instead of starting a
// second one. All replicas read the same group, which hands each record to
// one of them.
package trigger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/retry"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/internal/catalog"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/runner"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// Timing of readers.
const (
	// DefaultRefresh is how often the Manager re-reads the catalog when
	// Config leaves it zero.
	DefaultRefresh = 2 * time.Second
	// DefaultMessageTimeout is how long a reader may hold records before the
	// group hands them out again, when Config leaves it zero.
	DefaultMessageTimeout = 30 * time.Second
	// readBlock is how long a group read waits for records.
	readBlock = 5 * time.Second
	// batchLinger is how long a reader waits for a batch to fill once its
	// first record arrived; then it starts the run with what it has.
	batchLinger = time.Second
	// readRecords is about how many records one read asks for (whole
	// batches, at least one).
	readRecords = 100
	// finishTimeout bounds finishing the records in hand after the reader
	// is told to stop (a disable, a new version, a shutdown).
	finishTimeout = 20 * time.Second
)

// Retry policies: retrying starts and acks of the records in hand, and
// reading again after the streams service failed.
var (
	settlePolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}
	readPolicy   = retry.Policy{Initial: 200 * time.Millisecond, Max: 10 * time.Second}
)

// Source lists the triggers that run (the catalog).
type Source interface {
	Triggers(ctx context.Context) ([]catalog.Triggered, error)
}

// Starter starts runs (the runner).
type Starter interface {
	Start(ctx context.Context, req runner.StartRequest) (runner.StartResult, error)
}

// Streams is the part of the streams service's internal API readers use.
type Streams interface {
	CreateGroup(ctx context.Context, in *flov1.CreateGroupRequest, opts ...grpc.CallOption) (*flov1.ConsumerGroup, error)
	GroupRead(ctx context.Context, in *flov1.GroupReadRequest, opts ...grpc.CallOption) (*flov1.GroupReadResponse, error)
	Ack(ctx context.Context, in *flov1.AckRequest, opts ...grpc.CallOption) (*flov1.AckResponse, error)
	Nack(ctx context.Context, in *flov1.NackRequest, opts ...grpc.CallOption) (*flov1.NackResponse, error)
}

// Config tunes a Manager; zero values take the defaults.
type Config struct {
	// Refresh is how often the catalog is read for triggers.
	Refresh time.Duration
	// MessageTimeout is how long records read stay with this replica before
	// the group hands them out again: what a crash between reading a record
	// and acking it delays that record by.
	MessageTimeout time.Duration
}

// Manager runs one reader per triggered workflow.
type Manager struct {
	source   Source
	starter  Starter
	streams  Streams
	cfg      Config
	consumer string
	log      *slog.Logger
	// records counts records by what became of them.
	records metric.Int64Counter

	// readers is only touched by Run's goroutine.
	readers map[store.NameKey]*reader
}

// NewManager returns a Manager starting runs through starter for the
// triggers source lists, reading through streams; meter may be a no-op
// meter.
func NewManager(source Source, starter Starter, streams Streams, cfg Config, log *slog.Logger, meter metric.Meter) (*Manager, error) {
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.MessageTimeout <= 0 {
		cfg.MessageTimeout = DefaultMessageTimeout
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	records, err := meter.Int64Counter("flo.workflow.trigger.records", metric.WithUnit("{record}"),
		metric.WithDescription("Stream records read by triggers, by result: started (a run started), duplicate (it had a run already), refused (nacked for its input), disabled (nacked: the workflow is disabled) or failed (left for redelivery)."))
	if err != nil {
		return nil, fmt.Errorf("create metric: %w", err)
	}
	return &Manager{
		source: source, starter: starter, streams: streams, cfg: cfg, consumer: consumerName(),
		log: log.With("loop", "triggers"), readers: map[store.NameKey]*reader{}, records: records,
	}, nil
}

// Run keeps the readers in step with the catalog until ctx ends, then stops
// them, each finishing the records it holds.
func (m *Manager) Run(ctx context.Context) error {
	defer m.stopAll()
	t := time.NewTicker(m.cfg.Refresh)
	defer t.Stop()
	for {
		if err := m.refresh(ctx); err != nil && ctx.Err() == nil {
			m.log.WarnContext(ctx, "list stream triggers; trying again at the next refresh", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// spec is what a reader reads and starts; a change restarts the reader.
type spec struct {
	store.VersionKey
	streamNamespace string
	stream, group   string
	mode            definition.TriggerMode
	batch           int
}

func (m *Manager) refresh(ctx context.Context) error {
	ts, err := m.source.Triggers(ctx)
	if err != nil {
		return err
	}
	want := make(map[store.NameKey]spec, len(ts))
	for _, t := range ts {
		want[store.NameKey{Namespace: t.Namespace, Name: t.Name}] = spec{
			VersionKey: t.VersionKey, streamNamespace: t.Trigger.StreamNamespace(t.Namespace),
			stream: t.Trigger.Stream, group: t.Trigger.ConsumerGroup, mode: t.Trigger.Mode, batch: t.Trigger.BatchSize,
		}
	}
	for k, r := range m.readers {
		if s, ok := want[k]; !ok || s != r.spec {
			r.stop()
			delete(m.readers, k)
			m.log.InfoContext(ctx, "stream trigger stopped", "namespace", k.Namespace, "workflow", k.Name, "version", r.spec.Version)
		}
	}
	for k, s := range want {
		if _, ok := m.readers[k]; !ok {
			m.readers[k] = m.startReader(ctx, s)
			m.log.InfoContext(ctx, "stream trigger started", "namespace", k.Namespace, "workflow", k.Name, "version", s.Version,
				"stream", s.streamNamespace+"/"+s.stream, "group", s.group, "mode", s.mode, "batch_size", s.batch)
		}
	}
	return nil
}

func (m *Manager) stopAll() {
	var wg sync.WaitGroup
	for _, r := range m.readers {
		wg.Go(r.stop)
	}
	wg.Wait()
	clear(m.readers)
}

func (m *Manager) startReader(ctx context.Context, s spec) *reader {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &reader{m: m, spec: s, cancel: cancel, done: make(chan struct{}),
		log: m.log.With("namespace", s.Namespace, "workflow", s.Name, "stream", s.streamNamespace+"/"+s.stream, "group", s.group)}
	go func() {
		defer close(r.done)
		r.run(ctx)
	}()
	return r
}

// consumerName names this replica in its groups: the host name, cleaned to
// the consumer name rule, and a random suffix so two processes on one host
// differ.
func consumerName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "workflow"
	}
	host = badConsumerChars.ReplaceAllString(host, "-")
	if len(host) > 100 {
		host = host[:100]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "wf-" + host + "-" + hex.EncodeToString(b[:])
}

var badConsumerChars = regexp.MustCompile(`[^A-Za-z0-9._:-]`)

// reader reads one workflow's trigger.
type reader struct {
	m      *Manager
	spec   spec
	cancel context.CancelFunc
	done   chan struct{}
	log    *slog.Logger
}

// stop stops reading and waits for the records in hand to be settled.
func (r *reader) stop() {
	r.cancel()
	<-r.done
}

func (r *reader) run(ctx context.Context) {
	b := readPolicy.Backoff()
	needGroup := true
	for ctx.Err() == nil {
		if needGroup {
			if err := r.createGroup(ctx); err != nil {
				if ctx.Err() == nil {
					r.log.WarnContext(ctx, "create the trigger's consumer group; trying again", "err", err)
				}
				retry.Sleep(ctx, b.NextBackOff())
				continue
			}
			needGroup = false
		}
		recs, err := r.fill(ctx)
		if len(recs) > 0 {
			// Records in hand are started and settled even when the reader
			// is stopping, so a disable or shutdown leaves nothing waiting
			// for its message timeout.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
			paused := r.handle(fctx, recs)
			cancel()
			if paused {
				// The workflow was disabled (or removed) after the last
				// refresh, which will stop this reader; until then it
				// reads nothing, so the records it gave back wait.
				retry.Sleep(ctx, r.m.cfg.Refresh)
				continue
			}
		}
		switch {
		case err == nil:
			b.Reset()
		case ctx.Err() != nil:
		default:
			needGroup = status.Code(err) == codes.NotFound
			r.log.WarnContext(ctx, "read the trigger's stream; trying again", "err", err)
			retry.Sleep(ctx, b.NextBackOff())
		}
	}
}

// createGroup creates the group from the stream's first record; one that
// exists already is used as it is. A group that exists with another mode is
// an error the user must resolve (delete it, or name the mode it has).
func (r *reader) createGroup(ctx context.Context) error {
	_, err := r.m.streams.CreateGroup(ctx, &flov1.CreateGroupRequest{
		Namespace: r.spec.streamNamespace, Stream: r.spec.stream, Name: r.spec.group, Start: "-", Mode: string(r.spec.mode),
	})
	if status.Code(err) == codes.AlreadyExists {
		return nil
	}
	return err
}

// fill reads up to a few whole batches, waiting up to batchLinger for the
// last batch to fill once a read returned records.
func (r *reader) fill(ctx context.Context) ([]*flov1.StreamRecord, error) {
	want := max(1, readRecords/r.spec.batch) * r.spec.batch
	recs, err := r.read(ctx, want, readBlock)
	if err != nil || r.spec.batch == 1 {
		return recs, err
	}
	deadline := time.Now().Add(batchLinger)
	for len(recs)%r.spec.batch != 0 {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		more, err := r.read(ctx, r.spec.batch-len(recs)%r.spec.batch, left)
		recs = append(recs, more...)
		if err != nil {
			return recs, err
		}
	}
	return recs, nil
}

func (r *reader) read(ctx context.Context, count int, block time.Duration) ([]*flov1.StreamRecord, error) {
	resp, err := r.m.streams.GroupRead(ctx, &flov1.GroupReadRequest{
		Namespace: r.spec.streamNamespace, Stream: r.spec.stream, Group: r.spec.group, Consumer: r.m.consumer,
		Count: int32(count), BlockMs: block.Milliseconds(), MessageTimeoutMs: r.m.cfg.MessageTimeout.Milliseconds(),
	})
	if err != nil {
		return nil, fmt.Errorf("group read: %w", err)
	}
	return resp.GetRecords(), nil
}

// handle starts a run per batch of recs (ids and input in the order read),
// concurrently (the runner commits
// concurrent starts together), then acks the records whose run started. It
// nacks those whose start was refused for their input, so they reach the
// dead-letter stream after the group's max deliveries, and those of a
// workflow that is now disabled, so they wait in the group: then it reports
// paused. Records whose start failed otherwise stay with the reader until
// their message timeout hands them out again.
func (r *reader) handle(ctx context.Context, recs []*flov1.StreamRecord) (paused bool) {
	type outcome struct {
		ids     []string
		created bool
		err     error
	}
	var batches [][]*flov1.StreamRecord
	for len(recs) > 0 {
		n := min(r.spec.batch, len(recs))
		batches, recs = append(batches, recs[:n]), recs[n:]
	}
	out := make([]outcome, len(batches))
	var wg sync.WaitGroup
	for i, batch := range batches {
		wg.Go(func() {
			ids := make([]string, len(batch))
			for j, rec := range batch {
				ids[j] = rec.GetId()
			}
			created, err := r.start(ctx, batch, ids)
			out[i] = outcome{ids: ids, created: created, err: err}
		})
	}
	wg.Wait()
	var ack, nack, back []string
	for _, o := range out {
		kind, _, isFault := fault.KindOf(o.err)
		result := "failed"
		switch {
		case o.err == nil:
			ack = append(ack, o.ids...)
			result = "started"
			if !o.created {
				result = "duplicate"
			}
		case isFault && kind == fault.Invalid:
			r.log.WarnContext(ctx, "trigger's run refused; the records go back to the group", "records", o.ids, "err", o.err)
			nack = append(nack, o.ids...)
			result = "refused"
		case isFault:
			back = append(back, o.ids...)
			result = "disabled"
		default:
			r.log.WarnContext(ctx, "trigger's run not started; the records are handed out again after their message timeout",
				"records", o.ids, "err", o.err)
		}
		r.m.records.Add(ctx, int64(len(o.ids)), metric.WithAttributes(attribute.String("result", result)))
	}
	r.settle(ctx, ack, nil)
	r.settle(ctx, nack, errRefused)
	r.settle(ctx, back, errDisabled)
	return len(back) > 0
}

var (
	errRefused  = errors.New("the workflow refused the run")
	errDisabled = errors.New("the workflow is disabled")
)

// start starts the run of a batch, retrying until it is committed, refused,
// or no longer possible (the workflow disabled or removed).
// It reports whether the run is new: false when the records had runs.
func (r *reader) start(ctx context.Context, batch []*flov1.StreamRecord, ids []string) (created bool, err error) {
	req := runner.StartRequest{
		Namespace: r.spec.Namespace, Workflow: r.spec.Name, Version: r.spec.Version, Input: Input(batch, r.spec.batch > 1),
		Trigger: &runner.TriggerStart{StreamNamespace: r.spec.streamNamespace, Stream: r.spec.stream, Records: ids, Batch: r.spec.batch > 1},
	}
	if len(batch) == 1 {
		req.TraceContext = batch[0].GetTraceContext()
	}
	err = retry.Do(ctx, settlePolicy, func() error {
		res, err := r.m.starter.Start(ctx, req)
		if _, _, ok := fault.KindOf(err); ok {
			return retry.Permanent(err)
		}
		created = res.Created
		return err
	}, nil)
	return created, err
}

// settle acks ids, or nacks them with reason when reason is set, retrying
// until it succeeds or ctx ends.
func (r *reader) settle(ctx context.Context, ids []string, reason error) {
	if len(ids) == 0 {
		return
	}
	err := retry.Do(ctx, settlePolicy, func() error {
		var err error
		if reason == nil {
			_, err = r.m.streams.Ack(ctx, &flov1.AckRequest{Namespace: r.spec.streamNamespace, Stream: r.spec.stream, Group: r.spec.group, Ids: ids})
		} else {
			_, err = r.m.streams.Nack(ctx, &flov1.NackRequest{Namespace: r.spec.streamNamespace, Stream: r.spec.stream, Group: r.spec.group, Ids: ids, Reason: reason.Error()})
		}
		return err
	}, nil)
	if err != nil {
		// The runs started; a redelivery finds them by their keys.
		r.log.WarnContext(ctx, "settle trigger records; they are handed out again after their message timeout", "records", len(ids), "err", err)
	}
}

// Input is the input of the run records start: the payload of the one
// record, or with batch the array of the payloads. A payload that is not JSON
// becomes a JSON string (invalid UTF-8 replaced by U+FFFD).
func Input(recs []*flov1.StreamRecord, batch bool) json.RawMessage {
	if !batch {
		return payloadJSON(recs[0].GetPayload())
	}
	out := []byte{'['}
	for i, rec := range recs {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, payloadJSON(rec.GetPayload())...)
	}
	return append(out, ']')
}

func payloadJSON(p []byte) json.RawMessage {
	if len(p) > 0 && json.Valid(p) {
		return p
	}
	b, _ := json.Marshal(string(p))
	return b
}
