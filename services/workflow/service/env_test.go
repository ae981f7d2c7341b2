package service_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	workflowv1 "github.com/razorbill/flo/proto/gen/flo/workflow/v1"
	dispatcher "github.com/razorbill/flo/services/dispatcher/service"
	"github.com/razorbill/flo/services/workflow/service"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

const (
	waitFor = 30 * time.Second
	tick    = 20 * time.Millisecond
)

// env is a workflow service and a dispatcher on one fresh database and
// broker, with clients of both.
type env struct {
	dbURL      string
	brokers    []string
	wf         *wfReplica
	dispatcher dispatcherv1.DispatcherClient
}

func startEnv(t testing.TB) *env {
	t.Helper()
	broker := harness.NewBroker(t)
	e := &env{dbURL: harness.NewDatabase(t), brokers: broker.Addrs()}
	e.dispatcher = startDispatcher(t, e.dbURL, e.brokers)
	e.wf = startWorkflow(t, e.dbURL, e.brokers)
	return e
}

func testLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func startDispatcher(t testing.TB, dbURL string, brokers []string) dispatcherv1.DispatcherClient {
	t.Helper()
	cfg := dispatcher.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		BootstrapNamespaces: []string{"default"},
		Postgres:            config.Postgres{URL: dbURL, MaxConns: 8},
		Kafka:               config.Kafka{Brokers: brokers, Partitions: 4},
		Auth:                harness.InternalAuth(),
	}
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := dispatcher.New(ctx, cfg, testLog())
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	conn := harness.DialInternal(t, svc.GRPCAddr())
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Error("dispatcher did not stop")
		}
	})
	return dispatcherv1.NewDispatcherClient(conn)
}

// wfReplica is one running workflow service and a client of it.
type wfReplica struct {
	svc    *service.Service
	client workflowv1.WorkflowsClient
	stop   func()
}

// startWorkflow runs a workflow service, its config adjusted by opts; stop
// shuts it down gracefully and checks that Run returned nil.
func startWorkflow(t testing.TB, dbURL string, brokers []string, opts ...func(*service.Config)) *wfReplica {
	t.Helper()
	return startWorkflowWith(t, dbURL, brokers, testLog(), nil, opts...)
}

// startWorkflowWith is startWorkflow with a logger and service options.
func startWorkflowWith(t testing.TB, dbURL string, brokers []string, log *slog.Logger, svcOpts []service.Option, opts ...func(*service.Config)) *wfReplica {
	t.Helper()
	cfg := service.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		MaxPayloadBytes: 64 << 10, TimerTick: 200 * time.Millisecond,
		Postgres: config.Postgres{URL: dbURL, MaxConns: 8},
		Kafka:    config.Kafka{Brokers: brokers, Partitions: 4},
		Auth:     harness.InternalAuth(),
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := service.New(ctx, cfg, log, svcOpts...)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	conn := harness.DialInternal(t, svc.GRPCAddr())
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(time.Minute):
				t.Error("workflow service did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return &wfReplica{svc: svc, client: workflowv1.NewWorkflowsClient(conn), stop: stop}
}

// namespace creates a fresh namespace (in the dispatcher, which owns them).
func (e *env) namespace(t testing.TB) string {
	t.Helper()
	name := "ns-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	_, err := e.dispatcher.CreateNamespace(t.Context(), &flov1.CreateNamespaceRequest{Name: name})
	require.NoError(t, err)
	return name
}

func (e *env) client() workflowv1.WorkflowsClient { return e.wf.client }

// create stores a workflow definition.
func (e *env) create(t testing.TB, ns, yaml string) *flov1.CreateWorkflowResponse {
	t.Helper()
	resp, err := e.client().CreateWorkflow(t.Context(), &flov1.CreateWorkflowRequest{Namespace: ns, Yaml: yaml})
	require.NoError(t, err)
	return resp
}

// start starts a run and returns its id.
func (e *env) start(t testing.TB, ns, workflow, input, key string) string {
	t.Helper()
	resp, err := e.client().StartRun(t.Context(), &flov1.StartRunRequest{
		Namespace: ns, Workflow: workflow, Input: []byte(input), IdempotencyKey: key,
	})
	require.NoError(t, err)
	require.True(t, resp.GetCreated())
	return resp.GetRunId()
}

func (e *env) run(t testing.TB, ns, id string) *flov1.WorkflowRun {
	t.Helper()
	run, err := e.client().GetRun(t.Context(), &flov1.GetRunRequest{Namespace: ns, RunId: id})
	require.NoError(t, err)
	return run
}

// waitRun waits until the run has the given status.
func (e *env) waitRun(t testing.TB, ns, id string, want flov1.RunStatus) *flov1.WorkflowRun {
	t.Helper()
	var run *flov1.WorkflowRun
	require.Eventually(t, func() bool {
		run = e.run(t, ns, id)
		return run.GetStatus() == want || isEnded(run.GetStatus())
	}, waitFor, tick, "run %s never reached %s", id, want)
	require.Equal(t, want, run.GetStatus(), "run %s: error %q, terminal %q", id, run.GetError(), run.GetTerminal())
	return run
}

// waitWaiting waits until the run waits for a signal.
func (e *env) waitWaiting(t testing.TB, ns, id string) *flov1.WorkflowRun {
	t.Helper()
	var run *flov1.WorkflowRun
	require.Eventually(t, func() bool {
		run = e.run(t, ns, id)
		return run.GetWaitingFor() != "" || isEnded(run.GetStatus())
	}, waitFor, tick, "run %s never waited for a signal", id)
	require.Equal(t, flov1.RunStatus_RUN_STATUS_WAITING, run.GetStatus(), "run %s: %s", id, run.GetError())
	return run
}

func isEnded(s flov1.RunStatus) bool {
	switch s {
	case flov1.RunStatus_RUN_STATUS_COMPLETED, flov1.RunStatus_RUN_STATUS_FAILED,
		flov1.RunStatus_RUN_STATUS_CANCELLED, flov1.RunStatus_RUN_STATUS_TIMED_OUT:
		return true
	}
	return false
}

func (e *env) history(t testing.TB, ns, id string) []*flov1.HistoryEvent {
	t.Helper()
	h, err := e.client().GetRunHistory(t.Context(), &flov1.GetRunRequest{Namespace: ns, RunId: id})
	require.NoError(t, err)
	for i, ev := range h.GetEvents() {
		require.Equal(t, int64(i+1), ev.GetSeq(), "history of run %s is numbered in order", id)
	}
	return h.GetEvents()
}

// historyTypes renders a history as "type step" lines.
func historyTypes(evs []*flov1.HistoryEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.GetType() + " " + ev.GetStep()
	}
	return out
}

func (e *env) signal(t testing.TB, ns, id, typ, payload string) {
	t.Helper()
	_, err := e.client().SignalRun(t.Context(), &flov1.SignalRunRequest{Namespace: ns, RunId: id, Type: typ, Payload: []byte(payload)})
	require.NoError(t, err)
}

func requireCode(t testing.TB, want codes.Code, err error, msgContains string) {
	t.Helper()
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status: %v", err)
	require.Equal(t, want, st.Code(), st.Message())
	require.Contains(t, st.Message(), msgContains)
}

// reply is how a scripted action answers one attempt.
type reply struct {
	body, outcome string
	// fail, when set, fails the attempt with this error.
	fail         string
	retry        bool
	nonRetryable bool
	// code is the failure's error code.
	code string
	// pending answers that the result comes later, by completion token;
	// nobody here sends it, so the attempt waits until it times out.
	pending bool
}

func ok(body string) reply { return reply{body: body} }

// script answers the tasks of each action.
type script map[string]func(task *flov1.TaskAssignment) reply

// worker registers script's actions in ns (one attempt each, so a failure
// is final unless a step retries) and answers their tasks until the test
// ends, claiming and reporting through the dispatcher's internal API.
func (e *env) worker(t testing.TB, ns string, s script) {
	t.Helper()
	actions := make([]string, 0, len(s))
	for name := range s {
		actions = append(actions, name)
		_, err := e.dispatcher.RegisterAction(t.Context(), &flov1.RegisterActionRequest{Namespace: ns, Name: name, MaxAttempts: 1})
		require.NoError(t, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			resp, err := e.dispatcher.Claim(ctx, &dispatcherv1.ClaimRequest{
				Namespace: ns, Slots: []*dispatcherv1.ClaimSlot{{WorkerId: "scripted", Count: 64}}, Actions: actions, WaitMs: 500, LeaseMs: 30_000,
			})
			if err != nil {
				if ctx.Err() == nil {
					time.Sleep(50 * time.Millisecond)
				}
				continue
			}
			var reports []*dispatcherv1.Report
			for _, task := range resp.GetTasks() {
				r := s[task.GetAction()](task)
				rep := &dispatcherv1.Report{TaskId: task.GetTaskId(), Attempt: task.GetAttempt()}
				switch {
				case r.pending:
					rep.Kind = &dispatcherv1.Report_Pending{Pending: &flov1.Pending{}}
				case r.fail != "":
					rep.Kind = &dispatcherv1.Report_Failed{Failed: &flov1.Failed{Error: r.fail, Retry: r.retry, NonRetryable: r.nonRetryable, ErrorCode: r.code}}
				default:
					rep.Kind = &dispatcherv1.Report_Completed{Completed: &flov1.Completed{Body: []byte(r.body), Outcome: r.outcome}}
				}
				reports = append(reports, rep)
			}
			if len(reports) > 0 {
				// A worker that lost a report would leave its run hanging
				// until the lease expires; retry until it is taken.
				for ctx.Err() == nil {
					if _, err := e.dispatcher.Report(ctx, &dispatcherv1.ReportRequest{Namespace: ns, WorkerId: "scripted", Reports: reports}); err == nil {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}
