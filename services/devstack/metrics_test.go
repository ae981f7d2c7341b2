package devstack_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/services/devstack"
)

// scrape is one read of /metrics.
type scrape map[string]*dto.MetricFamily

// scrapeMetrics reads and parses the Prometheus text served at addr.
func scrapeMetrics(t *testing.T, addr string) scrape {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families
}

// value sums the series of the family name whose labels include labels (a
// counter's or gauge's value, a histogram's observation count); ok is false
// when no series matched.
func (s scrape) value(name string, labels ...string) (sum float64, ok bool) {
	f := s[name]
	if f == nil {
		return 0, false
	}
series:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				continue series
			}
		}
		ok = true
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, ok
}

// expectation is one series' expected value in a scrape.
type expectation struct {
	name   string
	labels []string
	want   float64
}

// mismatches lists the expectations s does not meet.
func (s scrape) mismatches(exps []expectation) []string {
	var out []string
	for _, e := range exps {
		got, ok := s.value(e.name, e.labels...)
		if !ok || got != e.want {
			out = append(out, fmt.Sprintf("%s%v = %v (found %v), want %v", e.name, e.labels, got, ok, e.want))
		}
	}
	return out
}

// requireMetrics scrapes until every expectation holds: counters move just
// after the commits the test waited for, and gauges are cached for a few
// seconds.
func requireMetrics(t *testing.T, addr string, exps []expectation) scrape {
	t.Helper()
	var (
		last scrape
		bad  []string
	)
	require.Eventually(t, func() bool {
		last = scrapeMetrics(t, addr)
		bad = last.mismatches(exps)
		return len(bad) == 0
	}, 60*time.Second, 200*time.Millisecond, "metrics never matched: %v", &bad)
	return last
}

const meteredWorkflowYAML = `kind: Workflow
name: metered
version: "1"
start:
  run: "@actions/step"
  transitions:
    success: flo.Completed
    failure: flo.Failed
`

func TestMetricsCountTheWorkload(t *testing.T) {
	const ns = "observed"
	e := newEnvWith(t, func(cfg *devstack.Config) { cfg.Namespaces = append(cfg.Namespaces, ns) })
	ctx := context.Background()
	client := e.client(t, ns)

	// work dead-letters on its first failure; backlog has no worker, so its
	// tasks stay queued.
	_, err := client.RegisterAction(ctx, "work", flo.ActionOptions{MaxAttempts: 1})
	require.NoError(t, err)
	_, err = client.RegisterAction(ctx, "backlog", flo.ActionOptions{})
	require.NoError(t, err)
	e.worker(t, ns, flo.ActionWorkerOptions{Concurrency: 4}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("work", func(actx *flo.ActionContext) ([]byte, error) {
			var in struct{ Outcome string }
			if err := actx.Into(&in); err != nil {
				return nil, err
			}
			switch in.Outcome {
			case "retryable":
				return nil, errors.New("upstream unavailable")
			case "fatal":
				return nil, flo.NewNonRetryableErrorf("malformed order")
			}
			return nil, nil
		})
		w.MustRegisterAction("step", func(*flo.ActionContext) ([]byte, error) { return nil, nil })
	})
	require.Eventually(t, func() bool {
		_, err := client.GetAction(ctx, "step")
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the worker never made its actions known")

	// 20 tasks of work: 12 complete, 4 dead-letter, 4 fail for good.
	const invoked, completed, deadLettered, failed, queued = 20, 12, 4, 4, 3
	for i := range invoked {
		outcome := "ok"
		switch i % 10 {
		case 6, 7:
			outcome = "retryable"
		case 8, 9:
			outcome = "fatal"
		}
		_, err := client.Invoke(ctx, "work", map[string]string{"outcome": outcome})
		require.NoError(t, err)
	}
	for range queued {
		_, err := client.Invoke(ctx, "backlog", map[string]string{})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		n := e.countByState(t, ns)
		return n["completed"] == completed && n["dead_lettered"] == deadLettered && n["failed"] == failed && n["queued"] == queued
	}, 60*time.Second, 50*time.Millisecond, "states: %v", e.countByState(t, ns))

	// Group audit acked 10 records and holds 4 more in its handler; billing
	// never read; late started after the first 10.
	streams := e.client(t, "default")
	_, err = streams.CreateStream(ctx, "metered", flo.StreamOptions{Partitions: 2})
	require.NoError(t, err)
	for _, g := range []string{"audit", "billing"} {
		_, err = streams.CreateGroup(ctx, "metered", g, flo.GroupOptions{})
		require.NoError(t, err)
	}
	appendN(t, streams, "metered", 10, 5)
	var (
		holding = make(chan struct{})
		held    atomic.Int64
		acked   atomic.Int64
	)
	e.streamWorker(t, flo.StreamWorkerOptions{Stream: "metered", Group: "audit"}, func(*flo.StreamContext) error {
		if acked.Load() < 10 {
			acked.Add(1)
			return nil
		}
		held.Add(1)
		<-holding
		return nil
	})
	t.Cleanup(func() { close(holding) }) // before the worker stops
	requireSettled(t, streams, "metered", "audit")
	require.EqualValues(t, 10, acked.Load())
	_, err = streams.CreateGroup(ctx, "metered", "late", flo.GroupOptions{Start: "$"})
	require.NoError(t, err)
	appendN(t, streams, "metered", 4, 2)
	require.Eventually(t, func() bool { return held.Load() == 4 }, 30*time.Second, 20*time.Millisecond)

	// Two runs of a one-step workflow.
	_, diags, err := client.CreateWorkflow(ctx, meteredWorkflowYAML)
	require.NoError(t, err, "diagnostics: %v", diags)
	for i := range 2 {
		_, err := client.StartWorkflow(ctx, "metered", map[string]int{"n": i}, flo.StartWorkflowOptions{})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, e.db.QueryRow(ctx,
			`SELECT count(*) FROM workflow.runs WHERE namespace = $1 AND status = 'completed'`, ns).Scan(&n))
		return n == 2
	}, 30*time.Second, 50*time.Millisecond, "runs did not complete")

	work := []string{"namespace", ns, "action", "work"}
	backlog := []string{"namespace", ns, "action", "backlog"}
	group := func(name string) []string {
		return []string{"namespace", "default", "stream", "metered", "group", name}
	}
	runStatus := func(status string) []string {
		return []string{"namespace", ns, "workflow", "metered", "status", status}
	}
	got := requireMetrics(t, e.stack.GatewayMetricsAddr(), []expectation{
		{"flo_tasks_invoked_total", work, invoked},
		{"flo_tasks_invoked_total", backlog, queued},
		{"flo_tasks_claimed_total", work, invoked},
		{"flo_tasks_completed_total", work, completed},
		{"flo_tasks_dead_lettered_total", work, deadLettered},
		{"flo_tasks_failed_total", work, failed},
		{"flo_tasks_invoke_to_start_duration_seconds", work, invoked},
		{"flo_tasks_queue_depth", work, 0},
		{"flo_tasks_queue_depth", backlog, queued},
		{"flo_tasks_queue_delayed", backlog, 0},
		{"flo_tasks_invoked_total", []string{"namespace", ns, "action", "step"}, 2},
		{"flo_dispatcher_view_lag", nil, 0},
		{"flo_outbox_backlog", []string{"schema", "registry"}, 0},
		{"flo_outbox_backlog", []string{"schema", "workflow"}, 0},
		{"flo_consumer_lag", []string{"topic", kafka.CommandsTopic, "group", "flo-dispatcher"}, 0},
		{"flo_consumer_lag", []string{"topic", kafka.TaskOutcomesTopic, "group", "flo-registry"}, 0},
		{"flo_streams_group_lag", group("audit"), 0},
		{"flo_streams_group_pending", group("audit"), 4},
		{"flo_streams_group_lag", group("billing"), 14},
		{"flo_streams_group_pending", group("billing"), 0},
		{"flo_streams_group_lag", group("late"), 4},
		{"flo_workers", []string{"namespace", ns, "type", "action"}, 1},
		{"flo_workers", []string{"namespace", ns, "type", "action", "status", "draining"}, 0},
		{"flo_workflow_runs", runStatus("completed"), 2},
		{"flo_workflow_runs", runStatus("running"), 0},
	})

	claims, ok := got.value("flo_tasks_claim_duration_seconds", "namespace", ns)
	require.True(t, ok, "claim latency is recorded")
	require.Positive(t, claims)
	age, ok := got.value("flo_tasks_queue_oldest_age_seconds", backlog...)
	require.True(t, ok)
	require.Positive(t, age, "the queued tasks have waited")
	retried, _ := got.value("flo_tasks_retried_total", work...)
	require.Zero(t, retried, "one attempt each: nothing was retried")
}
