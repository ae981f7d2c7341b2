// Package workerstream serves WorkerService.Stream, the one bidirectional
// stream each worker process keeps open. After a Hello the worker sends Ready
// messages that grant credit for tasks of some actions; the credit of every
// stream for the same actions and lease is claimed together, by one hub per
// gateway (hub.go), and the claimed tasks go down as TaskBatches. Results, nacks, abandons and touches go
// to the dispatcher as they arrive, a bounded number at a time. One writer
// goroutine owns Send and drains a bounded queue, so a slow worker slows its
// own session down instead of growing memory. The writer, and the goroutines
// that record results and stream acks, run only while their queue holds
// something (queue.go): an idle session is its handler and the goroutine
// blocked in Recv, plus one per outstanding stream read.
//
// A stream never holds more unreported tasks than its Hello's
// max_concurrency. When the registry says the worker is draining (a worker
// event on the log, a drain or heartbeat answered through this gateway, or
// the registry's answer when the stream opens) the session stops claiming,
// drops its credit, abandons whatever a claim still returns and sends the
// worker a Drain message; its reports keep flowing until it closes the
// stream.
//
// Heartbeats may come on the stream too (the HelloAck says stream_heartbeats):
// every session's go to the registry together, a Heartbeats call at a time,
// and each is answered with a HeartbeatAck (heartbeat.go).
//
// Stream workers use the same stream: the Hello subscribes to stream/group
// pairs, each StreamRead is answered by one RecordBatch, and the StreamReads
// of one group wait together in one GroupReadMany on the streams service
// (readhub.go), and StreamAck/StreamNack messages are
// coalesced into Ack and Nack calls. Reads take no task credit. Records that
// can no longer reach the worker are nacked at once rather than left pending
// until their message timeout.
//
// The stream is opened with a worker key (checked by the auth guard); the
// Hello's namespace must be the key's. A session reports, touches, nacks
// and abandons only the tasks it holds and settles only the records it
// sent, so a worker cannot act on another worker's work (see handover.go
// for how a reconnecting worker keeps its own).
package workerstream

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	registryv1 "github.com/razorbill/flo/proto/gen/flo/registry/v1"
	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"

	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/gateway/internal/auth"
)

const (
	// sendQueue is how many outgoing messages a session buffers before the
	// hubs and acknowledgements wait for the writer.
	sendQueue = 256
	// defaultBlock is how long a Ready is held open when it names no block_ms.
	defaultBlock = 30 * time.Second
	// maxBlock caps block_ms.
	maxBlock = 5 * time.Minute
	// maxClaimWait caps how long one Claim call waits for work.
	maxClaimWait = 30 * time.Second
	// claimSlack is how much longer than its wait a Claim call may take.
	claimSlack = 10 * time.Second
	// helloTimeout is how long a new stream may take to send its Hello.
	helloTimeout = 30 * time.Second
	// maxInFlight caps concurrent dispatcher calls (nacks, abandons, touches) per
	// stream; past it the reader stops reading and gRPC flow control pushes
	// back on the worker.
	maxInFlight = 64
	// MaxHelloActions caps the actions one Hello may declare: each becomes a
	// row the dispatcher ensures and a name every claim carries.
	MaxHelloActions = 1024
	// maxPools caps the distinct (actions, lease) combinations one stream's
	// Ready messages may name; each is a pool its hub claims for.
	maxPools = 16
	// maxCredit caps the outstanding Ready credit of one combination.
	maxCredit = 4096
	// maxReportResults and maxReportBytes bound the results one Report call
	// gathers from a stream's queue; one queued message may go over them.
	maxReportResults = 4096
	maxReportBytes   = 8 << 20
	// maxHeld caps the tasks a stream holds unreported.
	maxHeld = 4096
	// callTimeout bounds a report or abandon, retries included.
	callTimeout = 30 * time.Second
	// touchTimeout bounds a touch, retries included; a lease extension that
	// arrives late is worth little.
	touchTimeout = 10 * time.Second
	// batchOverhead is the room a TaskBatch leaves above the payload limit for
	// the fields around one maximal payload.
	batchOverhead = 64 << 10
	// registryCheckTimeout bounds the question a new stream asks the registry
	// (is this worker draining already?); without an answer in time the
	// stream carries on, since the registry is not on the task path.
	registryCheckTimeout = 2 * time.Second
)

// errNoStreams refuses a Hello that subscribes to streams on a gateway
// without a streams service.
var errNoStreams = status.Error(codes.Unavailable, "streams service not configured (FLO_STREAMS_ADDR)")

// Dispatcher is the part of the dispatcher's API a worker session uses.
type Dispatcher interface {
	EnsureActions(ctx context.Context, in *dispatcherv1.EnsureActionsRequest, opts ...grpc.CallOption) (*dispatcherv1.EnsureActionsResponse, error)
	Report(ctx context.Context, in *dispatcherv1.ReportRequest, opts ...grpc.CallOption) (*dispatcherv1.ReportResponse, error)
	Touch(ctx context.Context, in *dispatcherv1.TouchRequest, opts ...grpc.CallOption) (*flov1.TouchAck, error)
}

// Claimer leases tasks to workers: up to each of req.Slots' count to its
// worker, from whichever dispatcher replicas hold them; the response names
// each task's worker. Answers with tasks that arrive after the one it
// returned (from other replicas) it hands to late, which may be called
// after Claim returned and must hand those tasks out or abandon them.
type Claimer interface {
	Claim(ctx context.Context, req *dispatcherv1.ClaimRequest, late func(*dispatcherv1.ClaimResponse)) (*dispatcherv1.ClaimResponse, error)
}

// Streams is the part of the streams service's API a worker session uses.
type Streams interface {
	GroupReadMany(ctx context.Context, in *streamsv1.GroupReadManyRequest, opts ...grpc.CallOption) (*streamsv1.GroupReadManyResponse, error)
	Ack(ctx context.Context, in *flov1.AckRequest, opts ...grpc.CallOption) (*flov1.AckResponse, error)
	Nack(ctx context.Context, in *flov1.NackRequest, opts ...grpc.CallOption) (*flov1.NackResponse, error)
	Release(ctx context.Context, in *streamsv1.ReleaseRequest, opts ...grpc.CallOption) (*flov1.NackResponse, error)
}

// Registry is the part of the registry's API a worker session uses.
type Registry interface {
	GetWorker(ctx context.Context, in *flov1.GetWorkerRequest, opts ...grpc.CallOption) (*flov1.Worker, error)
	Heartbeats(ctx context.Context, in *registryv1.HeartbeatsRequest, opts ...grpc.CallOption) (*registryv1.HeartbeatsResponse, error)
}

// Options configure a Server.
type Options struct {
	// MaxPayloadBytes is the largest payload or result body accepted; it also
	// sizes TaskBatches so each stays a little above it.
	MaxPayloadBytes int
	// DrainTimeout is how long a session waits on shutdown for its worker to
	// report the tasks it holds before the stream ends.
	DrainTimeout time.Duration
	// CheckNamespace returns a gRPC status error when the namespace is empty
	// or unknown.
	CheckNamespace func(ctx context.Context, name string) error
	// Claimer sends the sessions' claims (services/gateway/internal/replicas).
	Claimer Claimer
	// Registry, when set, is asked whether a worker opening a stream is
	// draining already, and records the heartbeats streams carry (without
	// it they are answered with an error).
	Registry Registry
	// Streams, when set, serves stream workers' reads, acks and nacks;
	// without it a Hello that subscribes to streams is refused with
	// Unavailable.
	Streams Streams
	// MaxReadRecords caps the count of one GroupRead, so a read of records
	// at the payload limit stays receivable; zero means no cap below the
	// protocol's 10,000.
	MaxReadRecords int
	// Log receives session events.
	Log *slog.Logger
}

// Server implements flov1.WorkerServiceServer.
type Server struct {
	flov1.UnimplementedWorkerServiceServer

	dispatcher Dispatcher
	opts       Options

	shutdownOnce sync.Once
	shutdown     chan struct{}

	// reads runs the read hubs' rounds (readhub.go). They outlive the session
	// that asked (records they bring back after it ended are nacked), until
	// Close cancels those still waiting.
	reads     group
	readCtx   context.Context
	stopReads context.CancelFunc

	// sessions indexes the open sessions by namespace/worker id, so a drain
	// finds the streams of its worker; one worker may briefly have two
	// while it reconnects. left keeps what ended sessions held for their
	// worker's next stream; sessionsMu guards both.
	sessionsMu sync.Mutex
	sessions   map[string]map[*session]struct{}
	left       *leftovers

	// hubs claim for the sessions' pools (hub.go).
	hubs hubs
	// readHubs read for the sessions' StreamReads (readhub.go).
	readHubs readHubs

	// beats are the sessions' heartbeats waiting for the registry
	// (heartbeat.go).
	beats runQueue[beat]
}

// NewServer returns a Server that claims through opts.Claimer and reports
// through d.
func NewServer(d Dispatcher, opts Options) *Server {
	if opts.MaxReadRecords <= 0 || opts.MaxReadRecords > maxReadCount {
		opts.MaxReadRecords = maxReadCount
	}
	readCtx, stopReads := context.WithCancel(context.Background())
	s := &Server{
		dispatcher: d, opts: opts, shutdown: make(chan struct{}), sessions: make(map[string]map[*session]struct{}),
		left: newLeftovers(), readCtx: readCtx, stopReads: stopReads,
	}
	s.beats.init(heartbeatQueue, s.recordHeartbeats)
	return s
}

// Close cancels the group reads still waiting for records on behalf of
// sessions that ended and waits for them and their nacks. Call it after the
// gRPC server stopped, before the streams connection closes. Until then such
// reads run to their block time, so records the streams service handed out
// just as a session ended are nacked instead of stranded.
func (s *Server) Close() {
	s.stopReads()
	s.reads.closeAndWait()
}

// Shutdown makes new streams fail with Unavailable and tells open sessions to
// stop claiming, wait up to DrainTimeout for their workers to report what they
// hold, and end with Unavailable so the workers reconnect elsewhere.
func (s *Server) Shutdown() {
	s.shutdownOnce.Do(func() { close(s.shutdown) })
}

func (s *Server) stopping() bool {
	select {
	case <-s.shutdown:
		return true
	default:
		return false
	}
}

var errShuttingDown = status.Error(codes.Unavailable, "gateway is shutting down; reconnect")

// Stream serves one worker's session: Hello first, then the message loop.
func (s *Server) Stream(stream flov1.WorkerService_StreamServer) error {
	if s.stopping() {
		return errShuttingDown
	}
	ctx := stream.Context()
	hello, err := s.receiveHello(stream)
	if err != nil {
		return err
	}
	// The key in the stream's metadata authenticated the worker; a token in
	// the Hello, which older workers send, must be that same key.
	if t := hello.GetToken(); t != "" && subtle.ConstantTimeCompare([]byte(t), []byte(auth.IncomingBearer(ctx))) != 1 {
		return status.Error(codes.Unauthenticated, "the Hello's token is not the key the stream was opened with")
	}
	if err := auth.Check(ctx, flov1.WorkerService_Stream_FullMethodName, hello.GetNamespace()); err != nil {
		return err
	}
	principal, _ := auth.FromContext(ctx)
	if err := s.opts.CheckNamespace(ctx, hello.GetNamespace()); err != nil {
		return err
	}
	actions, err := helloActions(hello.GetActions())
	if err != nil {
		return err
	}
	if hello.GetMaxConcurrency() < 0 {
		return status.Errorf(codes.InvalidArgument, "Hello's max_concurrency %d must not be negative", hello.GetMaxConcurrency())
	}
	workerID := hello.GetWorkerId()
	if workerID == "" {
		workerID = "worker-" + uuid.NewString()
	} else if err := text.WorkerID("worker_id", workerID); err != nil {
		return status.Errorf(codes.InvalidArgument, "Hello's %v", err)
	}
	subs, err := helloStreams(hello.GetStreams(), workerID)
	if err != nil {
		return err
	}
	if len(subs) > 0 && s.opts.Streams == nil {
		return errNoStreams
	}
	if len(actions) > 0 {
		ectx, cancel := context.WithTimeout(ctx, callTimeout)
		err := retry(ectx, func(ctx context.Context) error {
			_, err := s.dispatcher.EnsureActions(ctx, &dispatcherv1.EnsureActionsRequest{Namespace: hello.GetNamespace(), Names: actions})
			return err
		})
		cancel()
		if err != nil {
			return status.Convert(err).Err()
		}
	}
	ack := &flov1.ServerMessage{Msg: &flov1.ServerMessage_HelloAck{HelloAck: &flov1.HelloAck{
		WorkerId: workerID, Namespace: hello.GetNamespace(), StreamHeartbeats: true,
	}}}
	if err := stream.Send(ack); err != nil {
		return err
	}
	log := s.opts.Log.With(slog.String("namespace", hello.GetNamespace()), slog.String("worker_id", workerID))
	log.InfoContext(ctx, "worker stream opened", slog.String("machine_id", hello.GetMachineId()), slog.Any("actions", actions),
		slog.Any("streams", subscriptionNames(subs)))
	sess := newSession(s, stream, hello.GetNamespace(), workerID, principal.KeyID, actions, subs, int(hello.GetMaxConcurrency()), log)
	s.track(sess)
	err = sess.run()
	s.retire(sess)
	log.InfoContext(ctx, "worker stream closed", slog.Any("reason", err))
	return err
}

// receiveHello reads the first message, which must be a Hello, within
// helloTimeout.
func (s *Server) receiveHello(stream flov1.WorkerService_StreamServer) (*flov1.Hello, error) {
	type received struct {
		msg *flov1.WorkerMessage
		err error
	}
	ch := make(chan received, 1)
	go func() {
		msg, err := stream.Recv()
		ch <- received{msg, err}
	}()
	timer := time.NewTimer(helloTimeout)
	defer timer.Stop()
	select {
	case r := <-ch:
		if errors.Is(r.err, io.EOF) {
			return nil, status.Error(codes.InvalidArgument, "the stream closed before its Hello")
		}
		if r.err != nil {
			return nil, r.err
		}
		hello := r.msg.GetHello()
		if hello == nil {
			return nil, status.Error(codes.InvalidArgument, "the first message on a worker stream must be Hello")
		}
		return hello, nil
	case <-timer.C:
		return nil, status.Errorf(codes.DeadlineExceeded, "no Hello within %s", helloTimeout)
	case <-s.shutdown:
		return nil, errShuttingDown
	}
}

// helloActions returns the Hello's action names sorted and without
// duplicates, rejecting malformed names and more than MaxHelloActions.
func helloActions(names []string) ([]string, error) {
	if len(names) > MaxHelloActions {
		return nil, status.Errorf(codes.InvalidArgument, "Hello names %d actions, at most %d", len(names), MaxHelloActions)
	}
	out := make([]string, 0, len(names))
	for i, n := range names {
		if err := text.Name(fmt.Sprintf("actions[%d]", i), n); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "Hello's %v", err)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
