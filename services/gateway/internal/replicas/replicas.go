// Package replicas sends a worker's claims to every dispatcher replica. Each
// replica owns some task partitions and holds their tasks in memory, and a
// task of any action may sit in any partition, so a claim has to reach them
// all. A claim is first split among the replicas, each asked for its share
// of the tasks without waiting, so that a busy queue is leased once;
// only a claim that finds nothing that way goes whole to each replica and
// waits there. A Set keeps the list of replicas fresh (ListReplicas through
// the gateway's one dispatcher connection, which any replica answers) and
// one connection per replica. Reports and touches go to the owner of their
// task's partition (Report, Touch); reads do not come here: the replica
// that receives one forwards it to the partition's owner.
package replicas

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/kafka"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

const (
	// defaultRefresh is how often the replica list is read when nothing
	// asks sooner: replicas come and go with rebalances, which take seconds.
	defaultRefresh = 2 * time.Second
	// listTimeout bounds one ListReplicas call.
	listTimeout = 2 * time.Second
	// answerGrace is how long past a claim's wait a replica may take to
	// answer before its call is given up: a replica that does not answer
	// (paused, cut off) must not hold every claim until its deadline.
	answerGrace = time.Second
	// settleGrace is how long the other calls of a claim that got its
	// tasks run on before they are ended (see settle), and how long a
	// claim's shares wait for the replicas still out once one answered:
	// long enough for an answer a replica is committing or sending to
	// arrive, short enough that an idle replica's call does not go on
	// taking tasks that will be abandoned.
	settleGrace = 100 * time.Millisecond
)

// Dispatcher is what a Set needs of the gateway's dispatcher client: the
// list of replicas, and the calls it sends to one replica or, when it knows
// none, through the default connection.
type Dispatcher interface {
	ListReplicas(ctx context.Context, in *dispatcherv1.ListReplicasRequest, opts ...grpc.CallOption) (*dispatcherv1.ListReplicasResponse, error)
	Claim(ctx context.Context, in *dispatcherv1.ClaimRequest, opts ...grpc.CallOption) (*dispatcherv1.ClaimResponse, error)
	EndClaim(ctx context.Context, in *dispatcherv1.EndClaimRequest, opts ...grpc.CallOption) (*dispatcherv1.EndClaimResponse, error)
	Report(ctx context.Context, in *dispatcherv1.ReportRequest, opts ...grpc.CallOption) (*dispatcherv1.ReportResponse, error)
	Touch(ctx context.Context, in *dispatcherv1.TouchRequest, opts ...grpc.CallOption) (*flov1.TouchAck, error)
}

// Options configure a Set.
type Options struct {
	// Dial are the options each replica's connection is dialed with: the
	// internal credentials and whatever else the default connection has
	// (see DialOptions for the authority).
	Dial []grpc.DialOption
	// Refresh is how often the list is read; zero means every 2 s.
	Refresh time.Duration
	// Log receives changes of the list and failures to read it.
	Log *slog.Logger
	// Partitions is the number of task partitions (FLO_KAFKA_PARTITIONS),
	// by which reports and touches find their owner; zero sends them all
	// through the default connection.
	Partitions int32
}

// Set is the dispatcher replicas a gateway claims from. Its zero value is
// not usable; call New.
type Set struct {
	def     Dispatcher
	dial    []grpc.DialOption
	refresh time.Duration
	log     *slog.Logger
	// stale asks Run to read the list now; a claim that failed in a way a
	// changed list explains sends on it.
	stale chan struct{}

	mu       sync.Mutex
	replicas map[string]*replica // by address; only Run replaces it
	// changed is closed, and replaced, when the list changes: claims
	// waiting at the old list end so that their callers ask the new one.
	changed chan struct{}
	// owned is the replica that owns each partition, by the last list; it
	// is replaced, never changed.
	owned      map[int32]*replica
	partitions int32

	// turns holds, by address, each replica's running credit in the smooth
	// weighted round robin that splits claims (see shares); behind, by
	// address, the replicas a claim's shares were last left behind at, still
	// unanswered: later claims split without them (see claimShares).
	turnsMu sync.Mutex
	turns   map[string]int
	behind  map[string]int
}

type replica struct {
	addr   string
	conn   *grpc.ClientConn
	client Dispatcher
	// weight is the number of partitions the replica owns, at least 1: the
	// share of a claim it is asked for.
	weight int
}

// New returns a Set that lists replicas through def. Until Run has read a
// list of two or more, claims go through def.
func New(def Dispatcher, opts Options) *Set {
	if opts.Refresh <= 0 {
		opts.Refresh = defaultRefresh
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Set{def: def, dial: opts.Dial, refresh: opts.Refresh, log: opts.Log, stale: make(chan struct{}, 1), changed: make(chan struct{}),
		partitions: opts.Partitions, turns: make(map[string]int), behind: make(map[string]int)}
}

// DialOptions returns base with the authority of the configured dispatcher
// address, target (host:port, optionally with a gRPC scheme). Replicas are
// dialed at the addresses they advertise, pod IPs in a cluster, while their
// certificates name the Service the gateway is configured with; with TLS the
// authority is the name the handshake verifies.
func DialOptions(base []grpc.DialOption, target string) []grpc.DialOption {
	return append(slices.Clip(base), grpc.WithAuthority(authority(target)))
}

// authority is the host:port part of a gRPC target, as gRPC derives the
// default authority: "dns:///flo-dispatcher:9101" -> "flo-dispatcher:9101".
func authority(target string) string {
	// A bare host:port parses as scheme and opaque part, with no path.
	u, err := url.Parse(target)
	if err != nil || u.Path == "" {
		return target
	}
	return strings.TrimPrefix(u.Path, "/")
}

// Run reads the replica list every Refresh interval, and at once when a
// claim asks, until ctx ends; then it closes the replicas' connections and
// later claims go through the default client.
func (s *Set) Run(ctx context.Context) error {
	defer s.update(ctx, nil)
	t := time.NewTicker(s.refresh)
	defer t.Stop()
	failing := false
	for {
		owned, err := s.list(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			// The list stays as it was: the replicas known may well be up
			// while the one that answered the list is not.
			if !failing {
				s.log.WarnContext(ctx, "list dispatcher replicas failed; keeping the list", slog.Any("error", err))
			}
			failing = true
		default:
			if failing {
				s.log.InfoContext(ctx, "dispatcher replicas listed again")
			}
			failing = false
			s.update(ctx, owned)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.stale:
		}
	}
}

// list asks the default client for the replicas: the partitions each owns,
// by address.
func (s *Set) list(ctx context.Context) (map[string][]int32, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	resp, err := s.def.ListReplicas(ctx, &dispatcherv1.ListReplicasRequest{})
	if err != nil {
		return nil, fmt.Errorf("list dispatcher replicas: %w", err)
	}
	owned := make(map[string][]int32, len(resp.GetReplicas()))
	for _, r := range resp.GetReplicas() {
		if r.GetAddress() != "" {
			owned[r.GetAddress()] = append(owned[r.GetAddress()], r.GetPartitions()...)
		}
	}
	return owned, nil
}

// update makes the connections match the replicas in owned (partitions by
// address): new replicas are dialed (lazily, so a dial costs nothing until
// the first claim), those that left are closed. A claim still running on a
// closed connection fails and skips that replica.
func (s *Set) update(ctx context.Context, owned map[string][]int32) {
	addrs := slices.Sorted(maps.Keys(owned))
	s.mu.Lock()
	old := s.replicas
	s.mu.Unlock()
	next := make(map[string]*replica, len(addrs))
	owners := make(map[int32]*replica)
	var added []string
	for _, a := range addrs {
		weight := max(len(owned[a]), 1)
		if r, ok := old[a]; ok {
			next[a] = &replica{addr: a, conn: r.conn, client: r.client, weight: weight}
			continue
		}
		conn, err := grpc.NewClient(a, s.dial...)
		if err != nil {
			s.log.WarnContext(ctx, "dial dispatcher replica failed; claims skip it", slog.String("addr", a), slog.Any("error", err))
			continue
		}
		next[a] = &replica{addr: a, conn: conn, client: dispatcherv1.NewDispatcherClient(conn), weight: weight}
		added = append(added, a)
	}
	for a, r := range next {
		for _, p := range owned[a] {
			owners[p] = r
		}
	}
	s.mu.Lock()
	s.replicas = next
	s.owned = owners
	grew := len(added) > 0
	if grew {
		close(s.changed)
		s.changed = make(chan struct{})
	}
	s.mu.Unlock()
	var removed []string
	for a, r := range old {
		if _, ok := next[a]; !ok {
			removed = append(removed, a)
			_ = r.conn.Close()
		}
	}
	if len(added) > 0 || len(removed) > 0 {
		// Credits of replicas that left would stay forever; new ones start
		// even.
		s.turnsMu.Lock()
		clear(s.turns)
		clear(s.behind)
		s.turnsMu.Unlock()
		slices.Sort(removed)
		s.log.InfoContext(ctx, "dispatcher replicas changed", slog.Any("replicas", addrs),
			slog.Any("added", added), slog.Any("removed", removed))
	}
}

// Report records reports at the replicas that own their tasks' partitions,
// each replica's reports in one call, the calls at once. Sent through the
// default connection, a report reaches a replica that passes it on to the
// owner unless it is the owner itself: with N replicas a second hop for all
// but one in N. Reports whose owner is not known, and those of a call to an
// owner that fails, go through the default connection, whose replica passes
// them on. It returns the rejected ids of all the calls, and the error of a
// call that failed both ways.
func (s *Set) Report(ctx context.Context, req *dispatcherv1.ReportRequest, opts ...grpc.CallOption) (*dispatcherv1.ReportResponse, error) {
	groups := map[Dispatcher][]*dispatcherv1.Report{}
	ownerOf := s.owners()
	for _, r := range req.GetReports() {
		c := ownerOf(r.GetTaskId())
		groups[c] = append(groups[c], r)
	}
	if len(groups) <= 1 {
		for c := range groups {
			return s.report(ctx, c, req, opts)
		}
		return s.def.Report(ctx, req, opts...)
	}
	var (
		mu       sync.Mutex
		rejected []string
		firstErr error
		wg       sync.WaitGroup
	)
	for c, reports := range groups {
		wg.Go(func() {
			resp, err := s.report(ctx, c, &dispatcherv1.ReportRequest{Namespace: req.GetNamespace(), WorkerId: req.GetWorkerId(), Reports: reports}, opts)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = cmp.Or(firstErr, err)
				return
			}
			rejected = append(rejected, resp.GetRejectedTaskIds()...)
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return &dispatcherv1.ReportResponse{RejectedTaskIds: rejected}, nil
}

// report sends req to c, and through the default connection when c, an
// owner, fails.
func (s *Set) report(ctx context.Context, c Dispatcher, req *dispatcherv1.ReportRequest, opts []grpc.CallOption) (*dispatcherv1.ReportResponse, error) {
	return ownerOrDefault(ctx, s, c, func(d Dispatcher) (*dispatcherv1.ReportResponse, error) { return d.Report(ctx, req, opts...) })
}

// Touch extends a lease at the replica that owns the task's partition, or
// through the default connection as Report does.
func (s *Set) Touch(ctx context.Context, req *dispatcherv1.TouchRequest, opts ...grpc.CallOption) (*flov1.TouchAck, error) {
	return ownerOrDefault(ctx, s, s.owners()(req.GetTaskId()), func(d Dispatcher) (*flov1.TouchAck, error) { return d.Touch(ctx, req, opts...) })
}

// ownerOrDefault makes call to c, an owner, and again through the default
// connection when it fails while ctx still runs.
func ownerOrDefault[T any](ctx context.Context, s *Set, c Dispatcher, call func(Dispatcher) (T, error)) (T, error) {
	out, err := call(c)
	if err != nil && c != s.def && ctx.Err() == nil {
		s.failed(err)
		return call(s.def)
	}
	return out, err
}

// owners returns, by the list known now, a function giving the client of
// the replica that owns a task's partition, or the default client when
// there is no such replica, or at most one.
func (s *Set) owners() func(taskID string) Dispatcher {
	s.mu.Lock()
	owners := s.owned
	if len(s.replicas) <= 1 || s.partitions <= 0 {
		owners = nil
	}
	s.mu.Unlock()
	return func(taskID string) Dispatcher {
		if owners == nil {
			return s.def
		}
		if r := owners[kafka.PartitionOf(taskID, s.partitions)]; r != nil {
			return r.client
		}
		return s.def
	}
}

// snapshot returns the replicas known now, and a channel closed when
// replicas are added.
func (s *Set) snapshot() ([]*replica, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*replica, 0, len(s.replicas))
	for _, r := range s.replicas {
		out = append(out, r)
	}
	return out, s.changed
}

// Claim leases up to each of req.Slots' count to its worker. With two or
// more replicas known it first asks each, at once, for its share of the
// count without waiting for work (see claimShares), and returns what they
// had. Only when none had anything does it send req whole to each, to wait
// for work there, and return the first answer with tasks. The other calls
// run on for settleGrace, so that answers already on their way arrive, and
// are then ended (see settle); the answers with tasks they bring are handed
// to late, after Claim returned, and the caller hands those tasks out or
// abandons them. Calls still running answerGrace past the wait are given up
// on. A replica that fails is skipped unless all do. With at most one
// replica known the default client is asked, as with a single dispatcher.
//
// A failure that a changed replica list explains (Unavailable, or
// FailedPrecondition: the replica no longer owns the partitions it had) has
// the list read at once; FailedPrecondition is answered as Unavailable, so
// the worker's session retries instead of ending.
func (s *Set) Claim(ctx context.Context, req *dispatcherv1.ClaimRequest, late func(*dispatcherv1.ClaimResponse)) (*dispatcherv1.ClaimResponse, error) {
	replicas, added := s.snapshot()
	if len(replicas) <= 1 {
		// One replica, or none known: the default client reaches it.
		replicas = []*replica{{addr: "default", client: s.def}}
	} else if resp, err := s.claimShares(ctx, replicas, req, late); err != nil || len(resp.GetTasks()) > 0 {
		return resp, err
	}
	whole := req
	if req.GetWaitMs() > 0 {
		whole = proto.Clone(req).(*dispatcherv1.ClaimRequest)
		whole.ClaimId = uuid.NewString()
	}
	reqs := make([]*dispatcherv1.ClaimRequest, len(replicas))
	for i := range reqs {
		reqs[i] = whole
	}
	c := s.start(ctx, replicas, reqs, giveUpAfter(req))
	var errs []error
	for c.waiting() {
		var a answer
		select {
		case a = <-c.answers:
			c.answered(a)
		case <-ctx.Done():
			// The caller is gone: nothing it asked for can reach it now.
			go s.settle(ctx, c, 0, late)
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-added:
			// A new replica may own the partitions with the work: the
			// caller asks the new list.
			go s.settle(ctx, c, settleGrace, late)
			return nil, nil
		}
		if a.err != nil {
			errs = append(errs, fmt.Errorf("claim from dispatcher replica %s: %w", a.addr, a.err))
			s.log.DebugContext(ctx, "claim from a dispatcher replica failed; skipping it", slog.String("addr", a.addr), slog.Any("error", a.err))
			continue
		}
		if len(a.resp.GetTasks()) > 0 {
			go s.settle(ctx, c, settleGrace, late)
			return a.resp, nil
		}
	}
	c.done()
	if len(errs) == len(replicas) {
		return nil, s.failed(errs[0])
	}
	for _, err := range errs {
		s.failed(err)
	}
	return nil, nil
}

// claimShares asks each replica at once for its share of req's slots (see
// shares), with no wait, and returns the tasks of all their answers. Each
// task is leased once: sent whole to every replica, a claim on a busy queue
// came back full from each, and all but the first answer's tasks were
// abandoned. A failing replica is skipped (the whole claim that follows an
// empty result reports failures). Once one replica has answered, the others
// get settleGrace before the claim returns without them: one that answers a
// claim that waits for nothing no sooner is busy, paused or cut off. Their
// calls are not cancelled then, nor when the caller gives up: a call
// cancelled while its replica records the leases loses its answer, and the
// tasks would wait for their leases to run out. What they bring goes to
// late; a replica that has not answered by the whole claim's deadline is
// given up on. Until a replica left behind answers, later claims are split
// among the others, so that a paused replica delays one claim, not each.
func (s *Set) claimShares(ctx context.Context, replicas []*replica, req *dispatcherv1.ClaimRequest,
	late func(*dispatcherv1.ClaimResponse)) (*dispatcherv1.ClaimResponse, error) {
	var (
		asked []*replica
		reqs  []*dispatcherv1.ClaimRequest
	)
	replicas = s.answering(replicas)
	for i, slots := range s.shares(replicas, req.GetSlots()) {
		if len(slots) > 0 {
			asked = append(asked, replicas[i])
			reqs = append(reqs, &dispatcherv1.ClaimRequest{Namespace: req.GetNamespace(), Actions: req.GetActions(), LeaseMs: req.GetLeaseMs(), Slots: slots})
		}
	}
	bound := giveUpAfter(req)
	c := s.start(ctx, asked, reqs, bound)
	merged := &dispatcherv1.ClaimResponse{}
	var rest <-chan time.Time
	for c.waiting() {
		var a answer
		select {
		case a = <-c.answers:
			c.answered(a)
		case <-ctx.Done():
			if len(merged.GetTasks()) > 0 {
				go late(merged)
			}
			go s.settle(ctx, c, bound, late)
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-rest:
			s.leaveBehind(c)
			go s.settle(ctx, c, bound, late)
			return merged, nil
		}
		if rest == nil {
			t := time.NewTimer(settleGrace)
			defer t.Stop()
			rest = t.C
		}
		if a.err != nil {
			s.failed(a.err)
			s.log.DebugContext(ctx, "claim of a share from a dispatcher replica failed; skipping it", slog.String("addr", a.addr), slog.Any("error", a.err))
			continue
		}
		merged.Tasks = append(merged.Tasks, a.resp.GetTasks()...)
		merged.WorkerIds = append(merged.WorkerIds, a.resp.GetWorkerIds()...)
	}
	c.done()
	return merged, nil
}

// answering returns the replicas no claim's shares were left behind at, or
// all when every one was.
func (s *Set) answering(replicas []*replica) []*replica {
	s.turnsMu.Lock()
	defer s.turnsMu.Unlock()
	if len(s.behind) == 0 {
		return replicas
	}
	out := make([]*replica, 0, len(replicas))
	for _, r := range replicas {
		if s.behind[r.addr] == 0 {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return replicas
	}
	return out
}

// leaveBehind counts the calls of c still out as left behind, until each
// answers (caughtUp).
func (s *Set) leaveBehind(c *calls) {
	c.behind = true
	s.turnsMu.Lock()
	defer s.turnsMu.Unlock()
	for addr := range c.out {
		s.behind[addr]++
	}
}

// caughtUp uncounts a call left behind at addr that answered.
func (s *Set) caughtUp(addr string) {
	s.turnsMu.Lock()
	defer s.turnsMu.Unlock()
	if s.behind[addr]--; s.behind[addr] <= 0 {
		delete(s.behind, addr)
	}
}

// shares splits slots among replicas in proportion to their weights, task
// by task, with a smooth weighted round robin whose credits carry over from
// claim to claim: a replica owning twice the partitions is asked for twice
// the tasks, and claims of one task take turns. It returns each replica's
// slots, in the order of replicas; a replica with no share has none.
func (s *Set) shares(replicas []*replica, slots []*dispatcherv1.ClaimSlot) [][]*dispatcherv1.ClaimSlot {
	total := 0
	for _, r := range replicas {
		total += r.weight
	}
	out := make([][]*dispatcherv1.ClaimSlot, len(replicas))
	counts := make([]int32, len(replicas))
	s.turnsMu.Lock()
	defer s.turnsMu.Unlock()
	for _, slot := range slots {
		clear(counts)
		// A count of zero is one, as the dispatcher reads it.
		for range max(slot.GetCount(), 1) {
			best := -1
			for i, r := range replicas {
				s.turns[r.addr] += r.weight
				if best < 0 || s.turns[r.addr] > s.turns[replicas[best].addr] {
					best = i
				}
			}
			s.turns[replicas[best].addr] -= total
			counts[best]++
		}
		for i, n := range counts {
			if n > 0 {
				out[i] = append(out[i], &dispatcherv1.ClaimSlot{WorkerId: slot.GetWorkerId(), Count: n})
			}
		}
	}
	return out
}

// giveUpAfter is how long a claim's calls may run: its wait, and
// answerGrace past it.
func giveUpAfter(req *dispatcherv1.ClaimRequest) time.Duration {
	return time.Duration(req.GetWaitMs())*time.Millisecond + answerGrace
}

// answer is one replica's answer to a claim.
type answer struct {
	addr string
	resp *dispatcherv1.ClaimResponse
	err  error
}

// calls are one claim's calls, one per replica. Only the goroutine that
// reads answers (Claim, then settle) touches out.
type calls struct {
	// id is the claim id the calls carry, for EndClaim; empty when they do
	// not wait.
	id string
	// behind says the calls still out were left behind (Set.behind).
	behind  bool
	answers chan answer
	// out are the calls not answered yet, by address.
	out map[string]*call
	// cancel ends every call; giveUp runs it when the claim's time is up.
	cancel context.CancelFunc
	giveUp *time.Timer
}

// call is one replica's call of a claim.
type call struct {
	r      *replica
	cancel context.CancelFunc
}

// start sends each replica its request, reqs[i] to replicas[i], at once,
// and gives them up (cancels them) after bound unless settle takes over.
// The requests differ in their slots only. The calls may outlive the caller
// (see settle), so they do not end with ctx, which the caller cancels once
// Claim returns.
func (s *Set) start(ctx context.Context, replicas []*replica, reqs []*dispatcherv1.ClaimRequest, bound time.Duration) *calls {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &calls{
		answers: make(chan answer, len(replicas)),
		out:     make(map[string]*call, len(replicas)),
		cancel:  cancel,
		giveUp:  time.AfterFunc(bound, cancel),
	}
	if len(reqs) > 0 {
		c.id = reqs[0].GetClaimId()
	}
	for i, r := range replicas {
		rctx, rcancel := context.WithCancel(cctx)
		c.out[r.addr] = &call{r: r, cancel: rcancel}
		go func() {
			resp, err := r.client.Claim(rctx, reqs[i])
			c.answers <- answer{addr: r.addr, resp: resp, err: err}
		}()
	}
	return c
}

// waiting says whether some call has not answered yet.
func (c *calls) waiting() bool { return len(c.out) > 0 }

// answered takes a's call off the calls still out.
func (c *calls) answered(a answer) {
	if o := c.out[a.addr]; o != nil {
		o.cancel()
		delete(c.out, a.addr)
	}
}

// done releases the calls once all have answered.
func (c *calls) done() {
	c.giveUp.Stop()
	c.cancel()
}

// settle collects the remaining answers of a claim that returned and hands
// those with tasks to late. After grace it ends the calls still out: a
// waiting claim (one with an id) is ended with EndClaim, so that its
// replica answers with whatever it leased by then, as when its wait ends;
// a cancelled call would lose an answer already on its way, and the tasks
// would wait for their leases to run out. Calls EndClaim does not find
// (already answered, never arrived, or a replica without EndClaim), and
// calls that wait for nothing, are cancelled settleGrace later, when an
// answer on its way has arrived. Whatever is still out answerGrace after the
// end is cancelled.
func (s *Set) settle(ctx context.Context, c *calls, grace time.Duration, late func(*dispatcherv1.ClaimResponse)) {
	c.giveUp.Stop()
	defer c.cancel()
	ctx = context.WithoutCancel(ctx)
	end := time.NewTimer(grace)
	defer end.Stop()
	var last <-chan time.Time
	for c.waiting() {
		select {
		case a := <-c.answers:
			c.answered(a)
			if c.behind {
				s.caughtUp(a.addr)
			}
			switch {
			case len(a.resp.GetTasks()) > 0:
				s.log.DebugContext(ctx, "tasks arrived after a claim was answered",
					slog.String("addr", a.addr), slog.Int("tasks", len(a.resp.GetTasks())))
				late(a.resp)
			case a.err != nil && status.Code(a.err) != codes.Canceled:
				s.failed(a.err)
			}
		case <-end.C:
			for _, o := range c.out {
				go s.end(ctx, c.id, o)
			}
			t := time.NewTimer(settleGrace + answerGrace)
			defer t.Stop()
			last = t.C
		case <-last:
			c.cancel()
			last = nil
		}
	}
}

// end ends one call of a claim that returned: with EndClaim when the claim
// has an id and the replica holds it, else by cancelling it settleGrace
// later.
func (s *Set) end(ctx context.Context, id string, o *call) {
	if id != "" {
		ctx, cancel := context.WithTimeout(ctx, answerGrace)
		resp, err := o.r.client.EndClaim(ctx, &dispatcherv1.EndClaimRequest{ClaimId: id})
		cancel()
		if err == nil && resp.GetEnded() {
			return
		}
	}
	time.AfterFunc(settleGrace, o.cancel)
}

// failed asks for a fresh list when err is what a changed list explains, and
// returns err as the claim's caller should see it.
func (s *Set) failed(err error) error {
	switch status.Code(err) {
	case codes.Unavailable:
	case codes.FailedPrecondition:
		err = status.Error(codes.Unavailable, err.Error())
	default:
		return err
	}
	select {
	case s.stale <- struct{}{}:
	default:
	}
	return err
}
