package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/config"
	dispatcher "github.com/razorbill/flo/services/dispatcher/service"
)

// benchBacklog measures what a backlog costs the dispatcher: it invokes
// o.tasks tasks with no worker running and waits until the view holds them
// all and the partitions have let the queued tasks past
// FLO_DISPATCH_QUEUED_TASKS go cold; it prints the tasks held and cold and
// the heap this process grew by. Then it restarts the dispatcher and starts
// the workers, and prints how long after the stop the first task started (the
// rebuild of every partition) and the rate at which the workers drained the
// backlog, cold tasks read back from the view as the partitions' queues
// empty.
func benchBacklog(ctx context.Context, p *platform, o options) error {
	var dcfg dispatcher.Config
	if err := config.Load(ctx, &dcfg); err != nil {
		return fmt.Errorf("load the dispatcher's configuration: %w", err)
	}
	if err := p.registerAction(ctx, "bench"); err != nil {
		return err
	}
	db, err := p.openDB(ctx)
	if err != nil {
		return err
	}
	inv, err := p.newInvoker(o)
	if err != nil {
		return err
	}
	before := heap()
	fmt.Printf("backlog: %d tasks (%s, %d invokers), no worker; FLO_DISPATCH_QUEUED_TASKS %d per partition, %d partitions, fsync=%v\n",
		o.tasks, inv.mode, o.invokers, dcfg.QueuedTasks, dcfg.Kafka.Partitions, o.fsync)
	start := time.Now()
	if err := chunks(o.invokers, o.tasks, inv.per, func(lo, hi int) error { return inv.invoke(ctx, hi-lo) }); err != nil {
		return err
	}
	invoked := time.Since(start)
	if err := waitState(ctx, db, "queued", o.tasks, start); err != nil {
		return err
	}
	viewed := time.Since(start)
	// Each partition lets its tasks past the bound go at its next batch
	// after the view reached them.
	most := o.tasks
	if dcfg.QueuedTasks > 0 {
		most = min(o.tasks, int(dcfg.Kafka.Partitions)*(dcfg.QueuedTasks+dcfg.QueuedTasks/10))
	}
	var held, cold int
	if err := waitFor(ctx, start, "queued tasks let go (cold)", func() (int, int, error) {
		var err error
		held, cold, _, err = queuedTasks(ctx, p.stack.GatewayMetricsAddr())
		return cold, o.tasks - most, err
	}); err != nil {
		return err
	}
	grown := heap() - before
	fmt.Printf("  invoked in %v (%.0f tasks/s); all in the view after %v\n", invoked.Round(time.Millisecond),
		perSecond(o.tasks, invoked), viewed.Round(time.Millisecond))
	fmt.Printf("  queued tasks held %d, cold %d; heap grew %.1f MB: %.0f bytes per task\n",
		held, cold, float64(grown)/(1<<20), float64(grown)/float64(o.tasks))

	// A new dispatcher rebuilds every partition from the view and the log.
	stopProfile, err := profile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	stopped := time.Now()
	if err := p.stack.StopDispatcher(); err != nil {
		return fmt.Errorf("stop the dispatcher: %w", err)
	}
	if err := p.stack.StartDispatcher(ctx); err != nil {
		return err
	}
	// The workers' sessions retry until the new dispatcher answers.
	first := make(chan time.Time, 1)
	err = p.startWorkers(o, map[string]actionHandler{
		"bench": func(*flo.ActionContext) ([]byte, error) {
			select {
			case first <- time.Now():
			default:
			}
			return nil, nil
		},
	})
	if err != nil {
		return err
	}
	if err := waitCompleted(ctx, db, o.tasks, stopped); err != nil {
		return err
	}
	drained := time.Since(stopped)
	fmt.Printf("  dispatcher restarted: the first task started %v after the stop\n", (<-first).Sub(stopped).Round(time.Millisecond))
	fmt.Printf("  drained in %v: %.0f tasks/s with %d workers x %d slots\n", drained.Round(time.Millisecond),
		perSecond(o.tasks, drained), o.workers, o.concurrency)
	return nil
}

// heap is the live heap of this process, after two collections: the
// first moves what sync.Pools hold aside, the second frees it, so pooled
// buffers, which grow with the time between collections, are not counted.
func heap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// queuedTasks sums the dispatcher's flo_dispatcher_queued_tasks gauge over
// its partitions, held and cold, as the stack's /metrics serves it; most is
// the most any one partition holds.
func queuedTasks(ctx context.Context, addr string) (held, cold, most int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("read metrics: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("read metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, 0, 0, fmt.Errorf("read metrics: %s: %s", resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("read metrics: %w", err)
	}
	for _, m := range families["flo_dispatcher_queued_tasks"].GetMetric() {
		n := int(m.GetGauge().GetValue())
		if label(m, "held") == "true" {
			held += n
			most = max(most, n)
		} else {
			cold += n
		}
	}
	return held, cold, most, nil
}

// label is the value of m's label name.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
