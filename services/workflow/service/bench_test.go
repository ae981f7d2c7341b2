package service_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/kafka"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// BenchmarkThreeStepRuns measures the workflow service with a dispatcher and
// trivial actions answered through the dispatcher's internal API: 1,000 runs
// of a three-step workflow per b.N, started by 64 concurrent callers.
// It reports runs/s and start-to-completion latency. Run it once:
//
//	go test ./service -run '^$' -bench ThreeStepRuns -benchtime 1x
func BenchmarkThreeStepRuns(b *testing.B) {
	e := startEnv(b)
	ns := e.namespace(b)
	e.create(b, ns, `kind: Workflow
name: bench
version: "1"
start:
  run: "@actions/step-a"
  transitions:
    success: b
steps:
  b:
    run: "@actions/step-b"
    transitions:
      success: c
  c:
    run: "@actions/step-c"
    transitions:
      success: flo.Completed
`)
	actions := []string{"step-a", "step-b", "step-c"}
	for _, a := range actions {
		_, err := e.dispatcher.RegisterAction(b.Context(), &flov1.RegisterActionRequest{Namespace: ns, Name: a, MaxAttempts: 1})
		require.NoError(b, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var workers sync.WaitGroup
	// The workers stop once ctx is cancelled, so cancel before waiting.
	defer func() { cancel(); workers.Wait() }()
	for w := range 4 {
		workers.Go(func() { fastWorker(ctx, e, ns, fmt.Sprintf("bench-%d", w), actions) })
	}

	runs := 1000 * b.N
	ended := make(chan map[string]time.Time, 1)
	go func() { ended <- watchEnds(ctx, b, e.brokers, runs) }()

	started := make(map[string]time.Time, runs)
	var mu sync.Mutex
	next := make(chan int, runs)
	for i := range runs {
		next <- i
	}
	close(next)
	b.ResetTimer()
	begin := time.Now()
	var starters sync.WaitGroup
	for range 64 {
		starters.Go(func() {
			for i := range next {
				resp, err := e.client().StartRun(ctx, &flov1.StartRunRequest{Namespace: ns, Workflow: "bench", Input: fmt.Appendf(nil, `{"i":%d}`, i)})
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				started[resp.GetRunId()] = time.Now()
				mu.Unlock()
			}
		})
	}
	starters.Wait()
	startedIn := time.Since(begin)
	var ends map[string]time.Time
	select {
	case ends = <-ended:
	case <-time.After(5 * time.Minute):
		b.Fatal("runs did not finish")
	}
	elapsed := time.Since(begin)
	b.StopTimer()

	latencies := make([]time.Duration, 0, runs)
	for id, at := range ends {
		if s, ok := started[id]; ok {
			latencies = append(latencies, at.Sub(s))
		}
	}
	slices.Sort(latencies)
	require.Len(b, latencies, runs)
	b.ReportMetric(float64(runs)/elapsed.Seconds(), "runs/s")
	b.ReportMetric(float64(runs)/startedIn.Seconds(), "starts/s")
	b.ReportMetric(float64(latencies[len(latencies)/2].Milliseconds()), "p50_ms")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Milliseconds()), "p99_ms")
}

// fastWorker completes every task at once, claiming in large batches.
func fastWorker(ctx context.Context, e *env, ns, id string, actions []string) {
	for ctx.Err() == nil {
		resp, err := e.dispatcher.Claim(ctx, &dispatcherv1.ClaimRequest{
			Namespace: ns, Slots: []*dispatcherv1.ClaimSlot{{WorkerId: id, Count: 256}}, Actions: actions, WaitMs: 500, LeaseMs: 60_000,
		})
		if err != nil || len(resp.GetTasks()) == 0 {
			continue
		}
		reports := make([]*dispatcherv1.Report, len(resp.GetTasks()))
		for i, task := range resp.GetTasks() {
			reports[i] = &dispatcherv1.Report{TaskId: task.GetTaskId(), Attempt: task.GetAttempt(),
				Kind: &dispatcherv1.Report_Completed{Completed: &flov1.Completed{Body: []byte(`{"ok":true}`)}}}
		}
		_, _ = e.dispatcher.Report(ctx, &dispatcherv1.ReportRequest{Namespace: ns, WorkerId: id, Reports: reports})
	}
}

// watchEnds collects when each run's ENDED event was received, until n runs
// ended.
func watchEnds(ctx context.Context, b *testing.B, brokers []string, n int) map[string]time.Time {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(kafka.RunEventsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(20*time.Millisecond))
	if err != nil {
		b.Error(err)
		return nil
	}
	defer cl.Close()
	out := make(map[string]time.Time, n)
	for len(out) < n && ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		now := time.Now()
		fetches.EachRecord(func(r *kgo.Record) {
			var ev eventsv1.RunEvent
			if proto.Unmarshal(r.Value, &ev) == nil && ev.GetType() == eventsv1.RunEventType_RUN_EVENT_TYPE_ENDED {
				out[ev.GetRunId()] = now
			}
		})
	}
	return out
}
