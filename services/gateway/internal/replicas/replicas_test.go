package replicas

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/internalauth"
	"github.com/razorbill/flo/libs/kafka"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// replicaServer is a dispatcher replica on a real gRPC server: it lists the
// replicas it is told to, answers claims as its claim func says, and counts
// claims, claims cancelled by the caller, list calls and open connections.
type replicaServer struct {
	dispatcherv1.UnimplementedDispatcherServer
	addr string

	// claim answers a claim; nil is idle.
	claim claimFunc
	// received gets a value for each claim that arrives, waiting for each
	// that waits for work.
	received, waiting chan struct{}

	mu     sync.Mutex
	listed []string
	// owned is the number of partitions each listed replica owns; one if
	// not set.
	owned map[string]int
	reqs  []*dispatcherv1.ClaimRequest
	// ends ends each claim with an id that is being answered.
	ends map[string]context.CancelCauseFunc
	// noEnd makes EndClaim unimplemented, as on an older replica.
	noEnd bool
	// reported and touched are the task ids of the reports and touches
	// received; reportErr, when set, fails every Report.
	reported, touched []string
	reportErr         error

	lists     atomic.Int32
	cancelled atomic.Int32
	ended     atomic.Int32
	conns     atomic.Int32
}

func startReplica(t *testing.T, claim claimFunc) *replicaServer {
	t.Helper()
	return serveReplica(t, "127.0.0.1", claim)
}

func serveReplica(t *testing.T, host string, claim claimFunc, opts ...grpc.ServerOption) *replicaServer {
	t.Helper()
	lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	r := &replicaServer{addr: lis.Addr().String(), claim: claim, received: make(chan struct{}, 100), waiting: make(chan struct{}, 100)}
	srv := grpc.NewServer(append(opts, grpc.StatsHandler(connCounter{&r.conns}))...)
	dispatcherv1.RegisterDispatcherServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r
}

func (r *replicaServer) list(addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listed = addrs
}

// own sets the number of partitions the replica at addr owns in the lists
// this one answers.
func (r *replicaServer) own(addr string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.owned == nil {
		r.owned = map[string]int{}
	}
	r.owned[addr] = n
}

func (r *replicaServer) refuseEnd() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.noEnd = true
}

func (r *replicaServer) claims() []*dispatcherv1.ClaimRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reqs)
}

func (r *replicaServer) ListReplicas(context.Context, *dispatcherv1.ListReplicasRequest) (*dispatcherv1.ListReplicasResponse, error) {
	r.lists.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	resp := &dispatcherv1.ListReplicasResponse{}
	next := int32(0)
	for _, a := range r.listed {
		rep := &dispatcherv1.Replica{Address: a}
		for range max(r.owned[a], 1) {
			rep.Partitions = append(rep.Partitions, next)
			next++
		}
		resp.Replicas = append(resp.Replicas, rep)
	}
	return resp, nil
}

// Claim answers as the replica's claim func says. A claim with an id can be
// ended by EndClaim: its func sees its context end with errEnded as the
// cause.
func (r *replicaServer) Claim(ctx context.Context, req *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
	cctx, end := context.WithCancelCause(ctx)
	defer end(nil)
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	if id := req.GetClaimId(); id != "" {
		if r.ends == nil {
			r.ends = map[string]context.CancelCauseFunc{}
		}
		r.ends[id] = end
		defer func() {
			r.mu.Lock()
			delete(r.ends, id)
			r.mu.Unlock()
		}()
	}
	r.mu.Unlock()
	r.received <- struct{}{}
	if req.GetWaitMs() > 0 {
		r.waiting <- struct{}{}
	}
	claim := r.claim
	if claim == nil {
		claim = idle
	}
	resp, err := claim(cctx, req)
	if ctx.Err() != nil {
		r.cancelled.Add(1)
	}
	return resp, err
}

// Report records the reports' task ids and rejects those ending in "x".
func (r *replicaServer) Report(_ context.Context, req *dispatcherv1.ReportRequest) (*dispatcherv1.ReportResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reportErr != nil {
		return nil, r.reportErr
	}
	resp := &dispatcherv1.ReportResponse{}
	for _, rep := range req.GetReports() {
		r.reported = append(r.reported, rep.GetTaskId())
		if strings.HasSuffix(rep.GetTaskId(), "x") {
			resp.RejectedTaskIds = append(resp.RejectedTaskIds, rep.GetTaskId())
		}
	}
	return resp, nil
}

func (r *replicaServer) Touch(_ context.Context, req *dispatcherv1.TouchRequest) (*flov1.TouchAck, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.touched = append(r.touched, req.GetTaskId())
	return &flov1.TouchAck{TaskId: req.GetTaskId(), Ok: true}, nil
}

func (r *replicaServer) failReports(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reportErr = err
}

func (r *replicaServer) reports() (reported, touched []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reported), slices.Clone(r.touched)
}

// errEnded is the cause of a claim's context that EndClaim ended.
var errEnded = errors.New("claim ended")

func (r *replicaServer) EndClaim(_ context.Context, req *dispatcherv1.EndClaimRequest) (*dispatcherv1.EndClaimResponse, error) {
	r.mu.Lock()
	if r.noEnd {
		r.mu.Unlock()
		return nil, status.Error(codes.Unimplemented, "no EndClaim here")
	}
	end, ok := r.ends[req.GetClaimId()]
	delete(r.ends, req.GetClaimId())
	r.mu.Unlock()
	if ok {
		r.ended.Add(1)
		end(errEnded)
	}
	return &dispatcherv1.EndClaimResponse{Ended: ok}, nil
}

// claimFunc is how a replicaServer answers a claim.
type claimFunc func(context.Context, *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error)

// idle has nothing ready, as a dispatcher answers then: empty once the
// claim's wait has passed or was ended, or as the caller gives up.
func idle(ctx context.Context, req *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
	wait := time.NewTimer(time.Duration(req.GetWaitMs()) * time.Millisecond)
	defer wait.Stop()
	select {
	case <-wait.C:
		return &dispatcherv1.ClaimResponse{}, nil
	case <-ctx.Done():
		if errors.Is(context.Cause(ctx), errEnded) {
			return &dispatcherv1.ClaimResponse{}, nil
		}
		return nil, ctx.Err()
	}
}

// silent never answers: the replica is paused or cut off.
func silent(ctx context.Context, _ *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// connCounter counts a server's open client connections.
type connCounter struct{ open *atomic.Int32 }

func (c connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (c connCounter) HandleRPC(context.Context, stats.RPCStats)                         {}
func (c connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (c connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	switch s.(type) {
	case *stats.ConnBegin:
		c.open.Add(1)
	case *stats.ConnEnd:
		c.open.Add(-1)
	}
}

// tasks has n tasks ready, named after prefix: it answers each claim at once
// with as many as its slots ask for, numbered on from the last answer's,
// each leased to its slot's worker.
func tasks(prefix string, n int) claimFunc {
	var mu sync.Mutex
	next := 0
	return func(_ context.Context, req *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		resp := &dispatcherv1.ClaimResponse{}
		for _, slot := range req.GetSlots() {
			for range slot.GetCount() {
				if next == n {
					return resp, nil
				}
				resp.Tasks = append(resp.Tasks, &flov1.TaskAssignment{TaskId: fmt.Sprintf("%s-%d", prefix, next), Attempt: 1})
				resp.WorkerIds = append(resp.WorkerIds, slot.GetWorkerId())
				next++
			}
		}
		return resp, nil
	}
}

// afterWaiting has nothing for a claim that waits for nothing, and answers a
// waiting claim with n tasks once other has a waiting claim too: so there
// is a call at other to end when this answer wins.
func afterWaiting(other *replicaServer, prefix string, n int) claimFunc {
	ready := tasks(prefix, n)
	return func(ctx context.Context, req *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
		if req.GetWaitMs() == 0 {
			return &dispatcherv1.ClaimResponse{}, nil
		}
		<-other.waiting
		return ready(ctx, req)
	}
}

func fails(code codes.Code) claimFunc {
	return func(context.Context, *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
		return nil, status.Error(code, "replica refuses")
	}
}

var plain = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) dispatcherv1.DispatcherClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return dispatcherv1.NewDispatcherClient(conn)
}

// run runs set until the test ends and waits until it knows want replicas.
func run(t *testing.T, set *Set, want int) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = set.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	require.Eventually(t, func() bool { reps, _ := set.snapshot(); return len(reps) == want }, 5*time.Second, 5*time.Millisecond)
	return cancel
}

// over returns a running Set whose default connection, to front, lists the
// replicas; its replica connections are dialed with opts.
func over(t *testing.T, front *replicaServer, opts []grpc.DialOption, replicas ...*replicaServer) *Set {
	t.Helper()
	return overPartitions(t, front, opts, 0, replicas...)
}

// overPartitions is over with reports and touches routed by partitions.
func overPartitions(t *testing.T, front *replicaServer, opts []grpc.DialOption, partitions int32, replicas ...*replicaServer) *Set {
	t.Helper()
	addrs := make([]string, len(replicas))
	for i, r := range replicas {
		addrs[i] = r.addr
	}
	front.list(addrs...)
	set := New(dial(t, front.addr, plain...), Options{Dial: opts, Refresh: time.Hour, Partitions: partitions})
	run(t, set, len(replicas))
	return set
}

// lateTasks collects the tasks of the answers a claim hands on late.
type lateTasks struct {
	mu  sync.Mutex
	ids []string
}

func (a *lateTasks) add(resp *dispatcherv1.ClaimResponse) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ids = append(a.ids, ids(resp)...)
}

func (a *lateTasks) list() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.ids)
}

func ids(resp *dispatcherv1.ClaimResponse) []string {
	out := make([]string, len(resp.GetTasks()))
	for i, t := range resp.GetTasks() {
		out[i] = t.GetTaskId()
	}
	return out
}

func claimReq(count int32) *dispatcherv1.ClaimRequest {
	return &dispatcherv1.ClaimRequest{Namespace: "ns", Slots: []*dispatcherv1.ClaimSlot{{WorkerId: "w", Count: count}}, Actions: []string{"a"}, WaitMs: 30_000}
}

func TestClaimWithOneReplicaGoesToTheDefaultConnection(t *testing.T) {
	t.Parallel()
	front := startReplica(t, tasks("front", 2))
	front.list(front.addr)
	set := New(dial(t, front.addr, plain...), Options{Dial: plain, Refresh: time.Hour})

	var ab lateTasks
	got, err := set.Claim(t.Context(), claimReq(1), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"front-0"}, ids(got), "before any list, the default connection claims")

	run(t, set, 1)
	got, err = set.Claim(t.Context(), claimReq(1), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"front-1"}, ids(got))
	reqs := front.claims()
	require.Len(t, reqs, 2)
	require.Equal(t, int64(30_000), reqs[1].GetWaitMs(), "a single replica gets the claim as it is")
	require.Equal(t, int32(1), front.conns.Load(), "a single replica costs no connection of its own")
	require.Empty(t, ab.list())
}

// With work ready at every replica, a claim is split among them in
// proportion to the partitions each owns, and no task is leased twice:
// sent whole to each, a busy queue came back full from every replica and
// all but one answer's tasks were abandoned.
func TestClaimSplitsAmongReplicasByThePartitionsTheyOwn(t *testing.T) {
	t.Parallel()
	a, b := startReplica(t, tasks("a", 100)), startReplica(t, tasks("b", 100))
	front := startReplica(t, nil)
	front.own(a.addr, 6)
	front.own(b.addr, 2)
	set := over(t, front, plain, a, b)

	var ab lateTasks
	req := claimReq(6)
	req.Slots = append(req.Slots, &dispatcherv1.ClaimSlot{WorkerId: "v", Count: 2})
	got, err := set.Claim(t.Context(), req, ab.add)
	require.NoError(t, err)
	require.Len(t, got.GetTasks(), 8, "each replica's share comes back")
	require.Empty(t, ab.list(), "nothing is leased beyond the claim")
	leased := map[string]int{}
	for _, w := range got.GetWorkerIds() {
		leased[w]++
	}
	require.Equal(t, map[string]int{"w": 6, "v": 2}, leased, "each worker gets what its slot asked for")
	askedOf := func(r *replicaServer) (n int32) {
		for _, req := range r.claims() {
			require.Zero(t, req.GetWaitMs(), "a share waits for nothing")
			for _, slot := range req.GetSlots() {
				n += slot.GetCount()
			}
		}
		return n
	}
	require.Equal(t, int32(6), askedOf(a), "the replica with three times the partitions is asked for three times the tasks")
	require.Equal(t, int32(2), askedOf(b))

	// Claims of one task take turns in the same proportion.
	for range 8 {
		got, err := set.Claim(t.Context(), claimReq(1), ab.add)
		require.NoError(t, err)
		require.Len(t, got.GetTasks(), 1)
	}
	require.Equal(t, int32(12), askedOf(a))
	require.Equal(t, int32(4), askedOf(b))
	require.Empty(t, front.claims(), "with two replicas the default connection claims nothing")
}

// A claim whose shares find nothing goes whole to every replica and waits
// there; the first answer with tasks wins and the other calls are
// cancelled.
func TestClaimWaitsWholeAtEveryReplicaWhenNoShareFindsWork(t *testing.T) {
	t.Parallel()
	waiting := startReplica(t, nil)
	ready := startReplica(t, afterWaiting(waiting, "a", 2))
	front := startReplica(t, tasks("front", 1))
	set := over(t, front, plain, ready, waiting)

	var ab lateTasks
	got, err := set.Claim(t.Context(), claimReq(5), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"a-0", "a-1"}, ids(got))
	require.Empty(t, ab.list())
	require.Empty(t, front.claims(), "with two replicas the default connection claims nothing")
	require.Eventually(t, func() bool { return waiting.ended.Load() == 1 }, 5*time.Second, 5*time.Millisecond,
		"the replica with nothing ready has its claim ended")
	require.Zero(t, waiting.cancelled.Load(), "not cancelled: an answer on its way would be lost")
	for _, r := range []*replicaServer{ready, waiting} {
		reqs := r.claims()
		require.Len(t, reqs, 2, "a share, then the whole claim")
		require.Zero(t, reqs[0].GetWaitMs())
		require.Empty(t, reqs[0].GetClaimId(), "a share waits for nothing: nobody ends it")
		require.Equal(t, int32(5), reqs[1].GetSlots()[0].GetCount(), "every replica is asked for the whole count")
		require.Equal(t, int64(30_000), reqs[1].GetWaitMs(), "and the whole wait")
		require.NotEmpty(t, reqs[1].GetClaimId())
	}
	require.Equal(t, ready.claims()[1].GetClaimId(), waiting.claims()[1].GetClaimId(), "one claim, one id")
}

// A claim that another replica answered first is ended, not cancelled: a
// replica that leased tasks as the end came answers with them, and they are
// handed on instead of lost until their leases run out.
func TestClaimEndedAfterTheWinnerStillBringsItsTasks(t *testing.T) {
	t.Parallel()
	slow := startReplica(t, func(ctx context.Context, req *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
		if req.GetWaitMs() == 0 {
			return &dispatcherv1.ClaimResponse{}, nil
		}
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), errEnded) {
			return nil, ctx.Err()
		}
		return tasks("slow", 1)(ctx, req)
	})
	fast := startReplica(t, afterWaiting(slow, "fast", 1))
	set := over(t, startReplica(t, nil), plain, slow, fast)

	var ab lateTasks
	got, err := set.Claim(t.Context(), claimReq(2), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"fast-0"}, ids(got))
	require.Eventually(t, func() bool { return len(ab.list()) == 1 }, 5*time.Second, 5*time.Millisecond,
		"the ended claim's task is handed on")
	require.Equal(t, []string{"slow-0"}, ab.list())
	require.Equal(t, int32(1), slow.ended.Load())
	require.Zero(t, slow.cancelled.Load())
}

// A replica without EndClaim has its call cancelled instead, as before.
func TestClaimCancelsWhatEndClaimDoesNotEnd(t *testing.T) {
	t.Parallel()
	old := startReplica(t, nil)
	old.refuseEnd()
	ready := startReplica(t, afterWaiting(old, "ready", 1))
	set := over(t, startReplica(t, nil), plain, old, ready)

	var ab lateTasks
	got, err := set.Claim(t.Context(), claimReq(2), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"ready-0"}, ids(got))
	require.Eventually(t, func() bool { return old.cancelled.Load() == 1 }, 5*time.Second, 5*time.Millisecond,
		"the waiting call is cancelled")
	require.Zero(t, old.ended.Load())

	// The replica is still claimed from.
	req := claimReq(2)
	req.WaitMs = 50
	_, err = set.Claim(t.Context(), req, ab.add)
	require.NoError(t, err)
	require.Len(t, old.claims(), 4, "a share and the whole claim, twice")
}

func TestClaimHandsOnTasksThatArriveAfterTheWinner(t *testing.T) {
	t.Parallel()
	waitingTasks := func(prefix string) claimFunc {
		ready := tasks(prefix, 2)
		return func(ctx context.Context, req *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
			if req.GetWaitMs() == 0 {
				return &dispatcherv1.ClaimResponse{}, nil
			}
			return ready(ctx, req)
		}
	}
	a, b := startReplica(t, waitingTasks("a")), startReplica(t, waitingTasks("b"))
	// Both answers to the waiting claims are held until both have arrived,
	// so the second is on its way when the first wins, as when two replicas
	// answer at once.
	var arrived sync.WaitGroup
	arrived.Add(2)
	both := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if c, ok := req.(*dispatcherv1.ClaimRequest); ok && c.GetWaitMs() > 0 {
			arrived.Done()
			arrived.Wait()
		}
		return err
	}
	set := over(t, startReplica(t, nil), append(slices.Clip(plain), grpc.WithUnaryInterceptor(both)), a, b)

	var ab lateTasks
	got, err := set.Claim(t.Context(), claimReq(3), ab.add)
	require.NoError(t, err)
	require.Len(t, got.GetTasks(), 2, "the first answer with tasks is the claim's")
	require.Eventually(t, func() bool { return len(ab.list()) == 2 }, 5*time.Second, 5*time.Millisecond,
		"the other answer's tasks are handed on late")
	all := append(ids(got), ab.list()...)
	require.ElementsMatch(t, []string{"a-0", "a-1", "b-0", "b-1"}, all, "no task is lost or doubled")
}

// A replica that does not answer its share (paused, cut off) does not hold
// back the others' tasks, later claims are split without it until it
// answers, and what it brings late is handed on.
func TestClaimSharesGoOutWithoutAReplicaThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	one := tasks("slow", 1)
	slow := startReplica(t, func(ctx context.Context, req *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
		<-release
		return one(ctx, req)
	})
	ready := startReplica(t, tasks("ready", 8))
	set := over(t, startReplica(t, nil), plain, slow, ready)

	var ab lateTasks
	got, err := set.Claim(t.Context(), claimReq(4), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"ready-0", "ready-1"}, ids(got), "the answering replica's share")
	got, err = set.Claim(t.Context(), claimReq(4), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"ready-2", "ready-3", "ready-4", "ready-5"}, ids(got), "the next claim is split without the silent replica")
	require.Len(t, slow.claims(), 1)

	close(release)
	require.Eventually(t, func() bool { return len(ab.list()) == 1 }, 5*time.Second, 5*time.Millisecond,
		"the late share's task is handed on")
	require.Equal(t, []string{"slow-0"}, ab.list())
	require.Zero(t, slow.cancelled.Load(), "a share left behind is not cancelled")
	got, err = set.Claim(t.Context(), claimReq(4), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"ready-6", "ready-7"}, ids(got), "once it answered, the replica has its share again")
	require.Len(t, slow.claims(), 2)
}

func TestClaimEndsWithItsCaller(t *testing.T) {
	t.Parallel()
	a, b := startReplica(t, nil), startReplica(t, nil)
	set := over(t, startReplica(t, nil), plain, a, b)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-a.waiting
		<-b.waiting
		cancel()
	}()
	var ab lateTasks
	_, err := set.Claim(ctx, claimReq(5), ab.add)
	require.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	require.Eventually(t, func() bool { return a.ended.Load() == 1 && b.ended.Load() == 1 }, 5*time.Second, 5*time.Millisecond,
		"the replicas' claims are ended")
}

func TestClaimSkipsAFailingReplicaAndReadsTheListAgain(t *testing.T) {
	t.Parallel()
	down := startReplica(t, fails(codes.Unavailable))
	// Nothing at first; then one task.
	var ready atomic.Bool
	up := startReplica(t, func(ctx context.Context, req *dispatcherv1.ClaimRequest) (*dispatcherv1.ClaimResponse, error) {
		if ready.Load() {
			return tasks("up", 1)(ctx, req)
		}
		return idle(ctx, req)
	})
	front := startReplica(t, nil)
	set := over(t, front, plain, down, up)
	lists := front.lists.Load()

	var ab lateTasks
	req := claimReq(4)
	req.WaitMs = 50
	got, err := set.Claim(t.Context(), req, ab.add)
	require.NoError(t, err, "one replica answering is enough")
	require.Empty(t, got.GetTasks())
	require.Eventually(t, func() bool { return front.lists.Load() > lists }, 5*time.Second, 5*time.Millisecond,
		"an unavailable replica has the list read at once, not at the next interval")

	ready.Store(true)
	got, err = set.Claim(t.Context(), claimReq(4), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"up-0"}, ids(got))
	require.Len(t, down.claims(), 3, "a failing replica still listed is asked again")
}

func TestClaimFailsOnlyWhenEveryReplicaFails(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b codes.Code
		want codes.Code
	}{
		{name: "unavailable", a: codes.Unavailable, b: codes.Unavailable, want: codes.Unavailable},
		// Not the owner any more: the session retries rather than ends.
		{name: "not the owner", a: codes.FailedPrecondition, b: codes.FailedPrecondition, want: codes.Unavailable},
		{name: "bad request", a: codes.InvalidArgument, b: codes.InvalidArgument, want: codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, b := startReplica(t, fails(tt.a)), startReplica(t, fails(tt.b))
			set := over(t, startReplica(t, nil), plain, a, b)
			var ab lateTasks
			_, err := set.Claim(t.Context(), claimReq(5), ab.add)
			require.Equal(t, tt.want, status.Code(err), "%v", err)
		})
	}
}

func TestClaimWithNothingReadyAnswersEmptyAfterEveryReplica(t *testing.T) {
	t.Parallel()
	a, b := startReplica(t, tasks("a", 0)), startReplica(t, tasks("b", 0))
	set := over(t, startReplica(t, nil), plain, a, b)
	var ab lateTasks
	got, err := set.Claim(t.Context(), claimReq(5), ab.add)
	require.NoError(t, err)
	require.Empty(t, got.GetTasks())
	require.Len(t, a.claims(), 2, "a share, then the whole claim")
	require.Len(t, b.claims(), 2)
}

func TestClaimGivesUpOnAReplicaThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	mute, empty := startReplica(t, silent), startReplica(t, tasks("empty", 0))
	set := over(t, startReplica(t, nil), plain, mute, empty)
	req := claimReq(5)
	req.WaitMs = 50
	start := time.Now()
	var ab lateTasks
	got, err := set.Claim(t.Context(), req, ab.add)
	require.NoError(t, err, "a replica given up on is skipped like one that failed")
	require.Empty(t, got.GetTasks())
	require.Less(t, time.Since(start), 5*time.Second, "the claim ends soon after its wait, not at its deadline")
	require.Eventually(t, func() bool { return mute.cancelled.Load() == 2 }, 5*time.Second, 5*time.Millisecond,
		"both its calls, the share and the whole claim, are cancelled")
}

func TestReplicasThatLeaveAreClosed(t *testing.T) {
	t.Parallel()
	a, b, c := startReplica(t, tasks("a", 0)), startReplica(t, tasks("b", 0)), startReplica(t, tasks("c", 0))
	front := startReplica(t, tasks("front", 0))
	front.list(a.addr, b.addr)
	set := New(dial(t, front.addr, plain...), Options{Dial: plain, Refresh: 10 * time.Millisecond})
	stop := run(t, set, 2)
	var ab lateTasks
	// Each claim, finding nothing, costs every replica a share and the
	// whole claim.
	_, err := set.Claim(t.Context(), claimReq(2), ab.add)
	require.NoError(t, err)
	require.Equal(t, int32(1), a.conns.Load())
	require.Equal(t, int32(1), b.conns.Load())

	front.list(b.addr, c.addr)
	require.Eventually(t, func() bool { return a.conns.Load() == 0 }, 5*time.Second, 5*time.Millisecond,
		"the connection of a replica that left is closed")
	_, err = set.Claim(t.Context(), claimReq(2), ab.add)
	require.NoError(t, err)
	require.Len(t, a.claims(), 2)
	require.Len(t, b.claims(), 4, "a replica that stays keeps its connection")
	require.Len(t, c.claims(), 2, "a replica that joined is claimed from")
	require.Equal(t, int32(1), b.conns.Load())

	stop()
	require.Eventually(t, func() bool { return b.conns.Load() == 0 && c.conns.Load() == 0 }, 5*time.Second, 5*time.Millisecond,
		"Run closes every replica connection when it ends")
	_, err = set.Claim(t.Context(), claimReq(1), ab.add)
	require.NoError(t, err)
	require.Len(t, front.claims(), 1, "after Run the default connection claims")
}

// TestReplicasAreDialedWithTheDispatchersNameAndToken dials replicas at
// addresses their certificate does not name (127.0.0.2), as pod IPs are not
// in a dispatcher's certificate: the authority of the configured address
// (localhost) is what the handshake verifies, and the internal token rides
// along.
func TestReplicasAreDialedWithTheDispatchersNameAndToken(t *testing.T) {
	t.Parallel()
	ca := harness.NewCA(t)
	cert, key := ca.Issue(t)
	auth := config.Auth{InternalToken: "internal-secret", InternalCertFile: cert, InternalKeyFile: key, InternalCAFile: ca.File}
	serverOpts, err := internalauth.ServerOptions(auth, nil)
	require.NoError(t, err)
	dialOpts, err := internalauth.DialOptions(auth, nil)
	require.NoError(t, err)
	b := serveReplica(t, "127.0.0.2", tasks("b", 0), serverOpts...)
	a := serveReplica(t, "127.0.0.2", tasks("a", 1), serverOpts...)
	front := serveReplica(t, "127.0.0.1", nil, serverOpts...)
	front.list(a.addr, b.addr)
	_, frontPort, err := net.SplitHostPort(front.addr)
	require.NoError(t, err)
	configured := "dns:///localhost:" + frontPort

	set := New(dial(t, configured, dialOpts...), Options{Dial: DialOptions(dialOpts, configured), Refresh: time.Hour})
	run(t, set, 2)
	var ab lateTasks
	got, err := set.Claim(t.Context(), claimReq(2), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"a-0"}, ids(got))
	require.Len(t, b.claims(), 1, "both replicas verified and accepted their share")

	// Without the authority the same replicas are refused by the handshake.
	bare := New(dial(t, configured, dialOpts...), Options{Dial: dialOpts, Refresh: time.Hour})
	run(t, bare, 2)
	_, err = bare.Claim(t.Context(), claimReq(1), ab.add)
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
}

func TestAuthority(t *testing.T) {
	t.Parallel()
	for target, want := range map[string]string{
		"flo-dispatcher:9101":             "flo-dispatcher:9101",
		"localhost:9101":                  "localhost:9101",
		"127.0.0.1:9101":                  "127.0.0.1:9101",
		"dns:///flo-dispatcher:9101":      "flo-dispatcher:9101",
		"dns://10.0.0.10/dispatcher:9101": "dispatcher:9101",
	} {
		require.Equal(t, want, authority(target), target)
	}
}

// A claim waiting at the replicas known when it was sent ends, empty, when a
// replica is added: the new one may own the partitions with the work, and
// the caller's next claim asks it too.
func TestClaimEndsWhenAReplicaIsAdded(t *testing.T) {
	t.Parallel()
	front, b := startReplica(t, nil), startReplica(t, tasks("b", 1))
	front.list(front.addr)
	set := New(dial(t, front.addr, plain...), Options{Dial: plain, Refresh: 10 * time.Millisecond})
	run(t, set, 1)
	req := claimReq(1)
	req.WaitMs = 60_000
	done := make(chan error, 1)
	var ab lateTasks
	go func() {
		got, err := set.Claim(t.Context(), req, ab.add)
		if err == nil && len(got.GetTasks()) > 0 {
			err = fmt.Errorf("got %d tasks from a replica that has none", len(got.GetTasks()))
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return len(front.claims()) == 1 }, 5*time.Second, 5*time.Millisecond)
	front.list(front.addr, b.addr)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the claim kept waiting at the old list")
	}
	got, err := set.Claim(t.Context(), claimReq(1), ab.add)
	require.NoError(t, err)
	require.Equal(t, []string{"b-0"}, ids(got), "the next claim reaches the added replica")
	require.Eventually(t, func() bool { return front.ended.Load() >= 1 }, 5*time.Second, 5*time.Millisecond,
		"the claim waiting at the old list was ended")
}

// idsOf returns n task ids of partition p of 4, each ending in suffix.
func idsOf(p int32, n int, suffix string) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		id := fmt.Sprintf("task-%d-%s", i, suffix)
		if kafka.PartitionOf(id, 4) == p {
			out = append(out, id)
		}
	}
	return out
}

// Reports and touches go to the replica that owns their task's partition,
// each replica's reports in one call, so no replica passes them on.
func TestReportsAndTouchesGoToTheirPartitionsOwner(t *testing.T) {
	t.Parallel()
	a, b := startReplica(t, nil), startReplica(t, nil)
	front := startReplica(t, nil)
	// The list gives a partitions 0 and 1, b 2 and 3.
	front.own(a.addr, 2)
	front.own(b.addr, 2)
	set := overPartitions(t, front, plain, 4, a, b)

	ofA := append(idsOf(0, 2, "a"), idsOf(1, 1, "x")...)
	ofB := append(idsOf(2, 1, "b"), idsOf(3, 2, "x")...)
	req := &dispatcherv1.ReportRequest{Namespace: "ns", WorkerId: "w"}
	for _, id := range append(slices.Clone(ofA), ofB...) {
		req.Reports = append(req.Reports, &dispatcherv1.Report{TaskId: id, Attempt: 1})
	}
	resp, err := set.Report(t.Context(), req)
	require.NoError(t, err)
	require.ElementsMatch(t, append(idsOf(1, 1, "x"), idsOf(3, 2, "x")...), resp.GetRejectedTaskIds(), "the rejections of both calls")
	gotA, _ := a.reports()
	gotB, _ := b.reports()
	gotFront, _ := front.reports()
	require.ElementsMatch(t, ofA, gotA)
	require.ElementsMatch(t, ofB, gotB)
	require.Empty(t, gotFront, "nothing through the default connection")

	ack, err := set.Touch(t.Context(), &dispatcherv1.TouchRequest{Namespace: "ns", TaskId: ofB[0], Attempt: 1})
	require.NoError(t, err)
	require.True(t, ack.GetOk())
	_, touched := b.reports()
	require.Equal(t, []string{ofB[0]}, touched)

	// An owner that fails has its reports sent through the default
	// connection, whose replica passes them on.
	b.failReports(status.Error(codes.Unavailable, "gone"))
	resp, err = set.Report(t.Context(), req)
	require.NoError(t, err)
	require.Len(t, resp.GetRejectedTaskIds(), 3)
	gotFront, _ = front.reports()
	require.ElementsMatch(t, ofB, gotFront)
}

// Without the partition count, or with one replica, reports take the
// default connection as before.
func TestReportsTakeTheDefaultConnectionWithoutOwners(t *testing.T) {
	t.Parallel()
	a, b := startReplica(t, nil), startReplica(t, nil)
	front := startReplica(t, nil)
	set := over(t, front, plain, a, b)
	ids := append(idsOf(0, 1, "a"), idsOf(3, 1, "b")...)
	req := &dispatcherv1.ReportRequest{Namespace: "ns", Reports: []*dispatcherv1.Report{{TaskId: ids[0]}, {TaskId: ids[1]}}}
	_, err := set.Report(t.Context(), req)
	require.NoError(t, err)
	got, _ := front.reports()
	require.ElementsMatch(t, ids, got)
}
