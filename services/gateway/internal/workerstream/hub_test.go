package workerstream

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"

	"github.com/razorbill/flo/services/gateway/internal/auth"
)

// These tests drive the hub with a Claimer whose every call the test
// answers, since what they check (which workers one call carries, where a
// task of a given worker id goes, when a call is cancelled) depends on the
// order of calls and answers, which a real dispatcher does not let a test
// choose. The dispatcher, which only sees abandons here, records them.

const hubWait = 10 * time.Second

// claimCall is one Claim call waiting for the test's answer.
type claimCall struct {
	req   *dispatcherv1.ClaimRequest
	ctx   context.Context
	reply chan *dispatcherv1.ClaimResponse
	late  func(*dispatcherv1.ClaimResponse)
}

// slots are the call's slots as worker id -> count.
func (c *claimCall) slots() map[string]int32 {
	out := map[string]int32{}
	for _, s := range c.req.GetSlots() {
		out[s.GetWorkerId()] = s.GetCount()
	}
	return out
}

// requireCancelled waits for the call's context to end.
func (c *claimCall) requireCancelled(t *testing.T, what string) {
	t.Helper()
	select {
	case <-c.ctx.Done():
	case <-time.After(hubWait):
		require.FailNow(t, what+" was not cancelled")
	}
}

// answer makes the call return tasks, each leased to the worker beside it.
func (c *claimCall) answer(taskWorkers ...string) { c.reply <- leased(taskWorkers...) }

// leased is a ClaimResponse of tasks, each leased to the worker beside it.
func leased(taskWorkers ...string) *dispatcherv1.ClaimResponse {
	resp := &dispatcherv1.ClaimResponse{}
	for i := 0; i+1 < len(taskWorkers); i += 2 {
		resp.Tasks = append(resp.Tasks, &flov1.TaskAssignment{TaskId: taskWorkers[i], Attempt: 1, Action: "a"})
		resp.WorkerIds = append(resp.WorkerIds, taskWorkers[i+1])
	}
	return resp
}

type answeredClaimer struct{ calls chan *claimCall }

func (a *answeredClaimer) Claim(ctx context.Context, req *dispatcherv1.ClaimRequest, late func(*dispatcherv1.ClaimResponse)) (*dispatcherv1.ClaimResponse, error) {
	c := &claimCall{req: req, ctx: ctx, reply: make(chan *dispatcherv1.ClaimResponse, 1), late: late}
	select {
	case a.calls <- c:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	select {
	case resp := <-c.reply:
		return resp, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// next returns the next Claim call.
func (a *answeredClaimer) next(t *testing.T) *claimCall {
	t.Helper()
	select {
	case c := <-a.calls:
		return c
	case <-time.After(hubWait):
		require.FailNow(t, "no claim call")
		return nil
	}
}

// abandonRecorder is a dispatcher that records the tasks abandoned to it.
type abandonRecorder struct {
	Dispatcher
	abandoned chan string
}

func (r *abandonRecorder) EnsureActions(context.Context, *dispatcherv1.EnsureActionsRequest, ...grpc.CallOption) (*dispatcherv1.EnsureActionsResponse, error) {
	return &dispatcherv1.EnsureActionsResponse{}, nil
}

func (r *abandonRecorder) Report(_ context.Context, req *dispatcherv1.ReportRequest, _ ...grpc.CallOption) (*dispatcherv1.ReportResponse, error) {
	for _, rep := range req.GetReports() {
		if rep.GetAbandon() != nil {
			r.abandoned <- rep.GetTaskId()
		}
	}
	return &dispatcherv1.ReportResponse{}, nil
}

// hubWorker is an open worker stream whose server messages are collected.
type hubWorker struct {
	stream flov1.WorkerService_StreamClient
	msgs   chan *flov1.ServerMessage
}

type hubEnv struct {
	client  flov1.WorkerServiceClient
	srv     *Server
	claimer *answeredClaimer
	disp    *abandonRecorder
	key     string
}

func newHubEnv(t *testing.T) *hubEnv {
	key, stored := keyOf(t, "ns", auth.RoleWorker)
	e := &hubEnv{claimer: &answeredClaimer{calls: make(chan *claimCall, 16)},
		disp: &abandonRecorder{abandoned: make(chan string, 100)}, key: key}
	e.client, e.srv = serveStreamsWith(t, e.disp, e.claimer, stored)
	return e
}

// worker opens a stream for workerID and sends a Ready of count for action a.
func (e *hubEnv) worker(t *testing.T, workerID string, count int32, blockMS int64) *hubWorker {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	stream, err := open(t, e.client, e.key, &flov1.Hello{Namespace: "ns", WorkerId: workerID, Actions: []string{"a"}})
	require.NoError(t, err)
	go func() {
		<-ctx.Done()
		_ = stream.CloseSend()
	}()
	w := &hubWorker{stream: stream, msgs: make(chan *flov1.ServerMessage, 100)}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				close(w.msgs)
				return
			}
			w.msgs <- m
		}
	}()
	w.ready(t, count, blockMS)
	return w
}

func (w *hubWorker) ready(t *testing.T, count int32, blockMS int64) {
	t.Helper()
	require.NoError(t, w.stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Ready{Ready: &flov1.Ready{Count: count, BlockMs: blockMS}}}))
}

// batch returns the task ids of the next TaskBatch.
func (w *hubWorker) batch(t *testing.T) []string {
	t.Helper()
	select {
	case m, ok := <-w.msgs:
		require.True(t, ok, "stream ended")
		require.NotNil(t, m.GetTaskBatch(), "%v", m)
		var ids []string
		for _, task := range m.GetTaskBatch().GetTasks() {
			ids = append(ids, task.GetTaskId())
		}
		return ids
	case <-time.After(hubWait):
		require.FailNow(t, "no task batch")
		return nil
	}
}

// call returns the next Claim call, which must be for the slots want
// (worker id -> count).
func (e *hubEnv) call(t *testing.T, want map[string]int32) *claimCall {
	t.Helper()
	c := e.claimer.next(t)
	require.Equal(t, want, c.slots())
	return c
}

// queued is how many pools wait in the queue of the hub of action a.
func (e *hubEnv) queued() int {
	e.srv.hubs.mu.Lock()
	h := e.srv.hubs.byKey["ns\x00"+poolKey([]string{"a"}, 0)]
	e.srv.hubs.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.queue)
}

func (e *hubEnv) abandoned(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		select {
		case id := <-e.disp.abandoned:
			out = append(out, id)
		case <-time.After(hubWait):
			require.FailNow(t, "too few abandons", "got %v", out)
		}
	}
	return out
}

func TestHubClaimsForItsWaitingWorkersInOneCall(t *testing.T) {
	t.Parallel()
	e := newHubEnv(t)
	w1 := e.worker(t, "w1", 2, 0)
	first := e.call(t, map[string]int32{"w1": 2})
	require.Equal(t, "ns", first.req.GetNamespace())
	require.Equal(t, []string{"a"}, first.req.GetActions())

	// Workers that come while the call waits join the next one, which
	// comes as soon as the first brings work.
	w2 := e.worker(t, "w2", 2, 0)
	w3 := e.worker(t, "w3", 1, 0)
	require.Eventually(t, func() bool { return e.queued() == 2 }, hubWait, time.Millisecond)
	first.answer("t1", "w1")
	require.Equal(t, []string{"t1"}, w1.batch(t))

	second := e.call(t, map[string]int32{"w1": 1, "w2": 2, "w3": 1})
	second.answer("t2", "w2", "t3", "w3", "t4", "w1", "t5", "w2")
	require.Equal(t, []string{"t4"}, w1.batch(t))
	require.Equal(t, []string{"t2", "t5"}, w2.batch(t))
	require.Equal(t, []string{"t3"}, w3.batch(t))
}

func TestHubAbandonsTasksNoWorkerCanTake(t *testing.T) {
	t.Parallel()
	e := newHubEnv(t)
	w1 := e.worker(t, "w1", 1, 0)
	call := e.claimer.next(t)
	// One past w1's credit, and one for a worker the call did not name.
	call.answer("t1", "w1", "t2", "w1", "t3", "stranger")
	require.Equal(t, []string{"t1"}, w1.batch(t))
	require.ElementsMatch(t, []string{"t2", "t3"}, e.abandoned(t, 2))
}

func TestHubHandsOutALateAnswerAsFarAsCreditGoes(t *testing.T) {
	t.Parallel()
	e := newHubEnv(t)
	w1 := e.worker(t, "w1", 2, 0)
	call := e.call(t, map[string]int32{"w1": 2})
	call.answer("t1", "w1")
	require.Equal(t, []string{"t1"}, w1.batch(t))
	// Another replica's answer to the same call, after it returned.
	call.late(leased("t2", "w1", "t3", "w1"))
	require.Equal(t, []string{"t2"}, w1.batch(t))
	require.Equal(t, []string{"t3"}, e.abandoned(t, 1))
}

func TestHubNeverPutsTwoStreamsOfOneWorkerInOneCall(t *testing.T) {
	t.Parallel()
	e := newHubEnv(t)
	a := e.worker(t, "twin", 1, 0)
	first := e.call(t, map[string]int32{"twin": 1})
	// The worker's second stream (a reconnect) waits meanwhile.
	b := e.worker(t, "twin", 1, 0)
	require.Eventually(t, func() bool { return e.queued() == 1 }, hubWait, time.Millisecond)
	first.answer()

	// The next call is for one stream only (b, which waited longer), and
	// its task goes to that stream; then the other stream's turn.
	second := e.call(t, map[string]int32{"twin": 1})
	second.answer("t1", "twin")
	require.Equal(t, []string{"t1"}, b.batch(t))
	third := e.call(t, map[string]int32{"twin": 1})
	third.answer("t2", "twin")
	require.Equal(t, []string{"t2"}, a.batch(t))
}

func TestHubAnswersAnExpiredReadyAndReissuesACallNobodyInWants(t *testing.T) {
	t.Parallel()
	e := newHubEnv(t)
	w1 := e.worker(t, "w1", 1, 200)
	first := e.call(t, map[string]int32{"w1": 1})
	// The Ready's block passes: an empty batch tells the worker to send it
	// again, and the call, while nobody else waits, goes on.
	require.Empty(t, w1.batch(t))

	// Another worker waits now: the call nobody in it wants is ended and
	// one for the waiting worker made.
	w2 := e.worker(t, "w2", 1, 0)
	second := e.call(t, map[string]int32{"w2": 1})
	first.requireCancelled(t, "the call nobody wanted")
	second.answer("t1", "w2")
	require.Equal(t, []string{"t1"}, w2.batch(t))
}

func TestHubEndsWithItsLastWorker(t *testing.T) {
	t.Parallel()
	e := newHubEnv(t)
	w1 := e.worker(t, "w1", 1, 0)
	call := e.claimer.next(t)
	require.NoError(t, w1.stream.CloseSend())
	call.requireCancelled(t, "the call of a worker that left")
	require.Eventually(t, func() bool {
		e.srv.hubs.mu.Lock()
		defer e.srv.hubs.mu.Unlock()
		return len(e.srv.hubs.byKey) == 0
	}, hubWait, time.Millisecond, "the hub without workers is dropped")
}
