package devstack_test

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

	flo "github.com/razorbill/flo-go"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
)

func TestZZLatency(t *testing.T) {
	e := newEnv(t)
	client := e.client(t, "default")
	ctx := context.Background()
	_, err := client.RegisterAction(ctx, "x", flo.ActionOptions{})
	require.NoError(t, err)
	var mu sync.Mutex
	startAt := map[string]time.Time{}
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 256}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("x", func(actx *flo.ActionContext) ([]byte, error) {
			mu.Lock()
			startAt[actx.TaskID()] = time.Now()
			mu.Unlock()
			return nil, nil
		})
	})
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 256}, func(w *flo.ActionWorker) {
		w.MustRegisterAction("x", func(actx *flo.ActionContext) ([]byte, error) {
			mu.Lock()
			startAt[actx.TaskID()] = time.Now()
			mu.Unlock()
			return nil, nil
		})
	})
	invAt := map[string]time.Time{}
	retAt := map[string]time.Time{}
	for range 300 {
		t0 := time.Now()
		id, err := client.Invoke(ctx, "x", nil)
		require.NoError(t, err)
		invAt[id] = t0
		retAt[id] = time.Now()
		time.Sleep(time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	cl, _ := kgo.NewClient(kgo.SeedBrokers(e.broker.Addrs()...), kgo.ConsumeTopics("flo.tasks.events"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	created := map[string]time.Time{}
	started := map[string]time.Time{}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for len(started) < 300 && cctx.Err() == nil {
		cl.PollFetches(cctx).EachRecord(func(r *kgo.Record) {
			var ev eventsv1.TaskEvent
			proto.Unmarshal(r.Value, &ev)
			switch ev.Type {
			case eventsv1.TaskEventType_TASK_EVENT_TYPE_CREATED:
				created[ev.TaskId] = ev.OccurredAt.AsTime()
			case eventsv1.TaskEventType_TASK_EVENT_TYPE_STARTED:
				started[ev.TaskId] = ev.OccurredAt.AsTime()
			}
		})
	}
	var a, b, c, d []time.Duration
	for id, t0 := range invAt {
		a = append(a, retAt[id].Sub(t0))
		b = append(b, created[id].Sub(t0))
		c = append(c, started[id].Sub(created[id]))
		d = append(d, startAt[id].Sub(started[id]))
	}
	for name, s := range map[string][]time.Duration{"invoke rtt": a, "invoke->created": b, "created->started": c, "started->handler": d} {
		slices.Sort(s)
		fmt.Println(name, "p50", s[len(s)/2], "p90", s[len(s)*9/10], "p99", s[len(s)*99/100])
	}
}
