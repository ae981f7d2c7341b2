package devstack_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
)

// TestWorkersIdleOnOneWaitingClaimAndShareABurst starts idle workers of one
// action on one gateway: together they cost the dispatcher one waiting
// claim, not one each. A task invoked then reaches one of them, and a
// burst of tasks is spread over all of them.
func TestWorkersIdleOnOneWaitingClaimAndShareABurst(t *testing.T) {
	const workers, burst = 10, 100
	e := newEnv(t)
	ctx := context.Background()
	client := e.client(t, "default")
	_, err := client.RegisterAction(ctx, "shared", flo.ActionOptions{})
	require.NoError(t, err)

	var (
		got  [workers]atomic.Int64
		mu   sync.Mutex
		done = map[string]bool{}
	)
	for i := range workers {
		e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 1}, func(w *flo.ActionWorker) {
			w.MustRegisterAction("shared", func(actx *flo.ActionContext) ([]byte, error) {
				got[i].Add(1)
				mu.Lock()
				done[actx.TaskID()] = true
				mu.Unlock()
				return nil, nil
			})
		})
	}
	waiting := func() float64 {
		n, _ := scrapeMetrics(t, e.stack.GatewayMetricsAddr()).value("flo_dispatcher_claims_waiting")
		return n
	}
	require.Eventually(t, func() bool { return waiting() == 1 }, 30*time.Second, 20*time.Millisecond,
		"the idle workers' claims never became one waiting claim")
	require.Eventually(t, func() bool {
		list, err := client.ListWorkers(ctx)
		require.NoError(t, err)
		return len(list) == workers
	}, 30*time.Second, 20*time.Millisecond, "the workers never all registered")
	require.Never(t, func() bool { return waiting() > 1 }, time.Second, 50*time.Millisecond,
		"%d idle workers of one action make one waiting claim", workers)

	first, err := client.Invoke(ctx, "shared", map[string]int{"n": 0})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return done[first]
	}, 30*time.Second, 20*time.Millisecond, "the task never reached an idle worker")

	for i := range burst {
		_, err = client.Invoke(ctx, "shared", map[string]int{"n": i + 1})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == burst+1
	}, 60*time.Second, 20*time.Millisecond, "the burst was not completed")
	t.Logf("tasks per worker: %v", counts(got[:]))
	for i := range workers {
		require.Positive(t, got[i].Load(), "worker %d got none of the burst (%v)", i, counts(got[:]))
	}
}

func counts(got []atomic.Int64) []int64 {
	out := make([]int64, len(got))
	for i := range got {
		out[i] = got[i].Load()
	}
	return out
}
