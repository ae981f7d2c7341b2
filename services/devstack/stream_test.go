package devstack_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// handled counts, per record id, the deliveries whose handler returned nil.
type handled struct {
	mu     sync.Mutex
	counts map[string]int
	total  atomic.Int64
}

func newHandled() *handled { return &handled{counts: map[string]int{}} }

func (h *handled) add(id string) {
	h.mu.Lock()
	h.counts[id]++
	h.mu.Unlock()
	h.total.Add(1)
}

// requireEachOnce waits until every id was handled, then checks none was
// handled twice and nothing else was handled.
func (h *handled) requireEachOnce(t *testing.T, ids []string, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return h.total.Load() >= int64(len(ids)) }, within, 50*time.Millisecond,
		"handled %d of %d records", h.total.Load(), len(ids))
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		require.Equal(t, 1, h.counts[id], "record %s handled %d times", id, h.counts[id])
	}
	require.Len(t, h.counts, len(ids), "records handled that were never appended")
	require.Equal(t, int64(len(ids)), h.total.Load())
}

// streamWorker starts a StreamWorker on its own client; it stops at cleanup
// or when the returned stop is called, which waits for Start to return.
func (e *env) streamWorker(t *testing.T, opts flo.StreamWorkerOptions, handler func(*flo.StreamContext) error) (stop func()) {
	t.Helper()
	c := e.client(t, "default")
	w, err := c.NewStreamWorker(opts, handler)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("stream worker: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("stream worker did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// appendN appends n records {"i": k} in batches from several goroutines and
// returns their ids in order of k.
func appendN(t *testing.T, c *flo.Client, stream string, n, batch int) []string {
	t.Helper()
	ids := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				from := int(next.Add(int64(batch))) - batch
				if from >= n {
					return
				}
				to := min(from+batch, n)
				payloads := make([]any, 0, to-from)
				for k := from; k < to; k++ {
					payloads = append(payloads, map[string]int{"i": k})
				}
				got, err := c.AppendMany(context.Background(), stream, payloads)
				if !assertNoError(t, err) {
					return
				}
				copy(ids[from:to], got)
			}
		})
	}
	wg.Wait()
	return ids
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("append: %v", err)
		return false
	}
	return true
}

// requireSettled waits until the group has neither lag nor pending records.
func requireSettled(t *testing.T, c *flo.Client, stream, group string) {
	t.Helper()
	require.Eventually(t, func() bool {
		groups, err := c.ListGroups(context.Background(), stream)
		require.NoError(t, err)
		for _, g := range groups {
			if g.Name == group {
				return g.Lag == 0 && g.Pending == 0
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "group %s/%s never settled", stream, group)
}

func TestStreamWorkersInOneGroupShareEveryRecordAndAnotherGroupSeesAll(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, "default")
	ctx := context.Background()
	_, err := c.CreateStream(ctx, "events", flo.StreamOptions{Partitions: 4})
	require.NoError(t, err)

	const n = 100_000
	ids := appendN(t, c, "events", n, 1000)
	seen := map[string]bool{}
	for _, id := range ids {
		require.NotEmpty(t, id)
		require.False(t, seen[id], "id %s returned twice", id)
		seen[id] = true
	}

	processors := newHandled()
	perWorker := make([]atomic.Int64, 3)
	for w := range 3 {
		e.streamWorker(t, flo.StreamWorkerOptions{Stream: "events", Group: "processors", Concurrency: 64, BatchSize: 200},
			func(sctx *flo.StreamContext) error {
				var ev struct{ I int }
				if err := sctx.Into(&ev); err != nil {
					return err
				}
				if ids[ev.I] != sctx.StreamID() {
					return fmt.Errorf("record %d has id %s, append returned %s", ev.I, sctx.StreamID(), ids[ev.I])
				}
				processors.add(sctx.StreamID())
				perWorker[w].Add(1)
				return nil
			})
	}
	processors.requireEachOnce(t, ids, 3*time.Minute)
	requireSettled(t, c, "events", "processors")
	for w := range perWorker {
		require.Positive(t, perWorker[w].Load(), "worker %d got no records: the group did not share the stream", w)
	}

	audit := newHandled()
	e.streamWorker(t, flo.StreamWorkerOptions{Stream: "events", Group: "audit", Concurrency: 64, BatchSize: 500},
		func(sctx *flo.StreamContext) error {
			audit.add(sctx.StreamID())
			return nil
		})
	audit.requireEachOnce(t, ids, 3*time.Minute)
	requireSettled(t, c, "events", "audit")

	info, err := c.GetStream(ctx, "events")
	require.NoError(t, err)
	require.Equal(t, int64(n), info.Length)
	require.Len(t, info.Groups, 2)
}

func TestStreamHandlerErrorsAndPanicsRedeliverAndMaxDeliveriesDeadLetter(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, "default")
	ctx := context.Background()
	_, err := c.CreateStream(ctx, "orders", flo.StreamOptions{})
	require.NoError(t, err)
	_, err = c.CreateGroup(ctx, "orders", "billing", flo.GroupOptions{MaxDeliveries: 3})
	require.NoError(t, err)

	kinds := []string{"ok", "fail-once", "panic-once", "always-fail"}
	ids := map[string]string{}
	for _, k := range kinds {
		id, err := c.Append(ctx, "orders", map[string]string{"kind": k}, flo.WithHeaders(map[string]string{"kind": k}))
		require.NoError(t, err)
		ids[k] = id
	}

	var mu sync.Mutex
	deliveries := map[string][]int{} // kind -> delivery counts seen by the handler
	succeeded := map[string]int{}
	e.streamWorker(t, flo.StreamWorkerOptions{Stream: "orders", Group: "billing", Concurrency: 4},
		func(sctx *flo.StreamContext) error {
			kind := sctx.Headers()["kind"]
			mu.Lock()
			deliveries[kind] = append(deliveries[kind], sctx.DeliveryCount())
			first := len(deliveries[kind]) == 1
			mu.Unlock()
			switch {
			case kind == "fail-once" && first:
				return errors.New("transient")
			case kind == "panic-once" && first:
				panic("handler bug")
			case kind == "always-fail":
				return errors.New("poison record")
			}
			mu.Lock()
			succeeded[kind]++
			mu.Unlock()
			return nil
		})

	dead := waitRecords(t, c, "orders.dlq", 1)
	require.Equal(t, `{"kind":"always-fail"}`, string(dead[0].Payload))
	require.Equal(t, ids["always-fail"], dead[0].Headers["flo-source-id"])
	require.Equal(t, "billing", dead[0].Headers["flo-group"])
	requireSettled(t, c, "orders", "billing")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"ok": 1, "fail-once": 1, "panic-once": 1}, succeeded)
	require.Equal(t, []int{1}, deliveries["ok"])
	require.Equal(t, []int{1, 2}, deliveries["fail-once"])
	require.Equal(t, []int{1, 2}, deliveries["panic-once"])
	require.Equal(t, []int{1, 2, 3}, deliveries["always-fail"], "max deliveries bounds the handler's tries")
}

// waitRecords reads a stream from the start until it holds want records.
func waitRecords(t *testing.T, c *flo.Client, stream string, want int) []*flo.Record {
	t.Helper()
	var recs []*flo.Record
	require.Eventually(t, func() bool {
		var err error
		recs, _, err = c.Read(context.Background(), stream, flo.ReadOptions{Count: want + 1})
		if err != nil {
			return false // the dead-letter stream appears with its first record
		}
		return len(recs) >= want
	}, 30*time.Second, 50*time.Millisecond, "stream %s never held %d records", stream, want)
	require.Len(t, recs, want)
	return recs
}

func TestKilledConsumersRecordsAreRedeliveredAfterTheMessageTimeout(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, "default")
	ctx := context.Background()
	_, err := c.CreateStream(ctx, "jobs", flo.StreamOptions{Partitions: 2})
	require.NoError(t, err)
	_, err = c.CreateGroup(ctx, "jobs", "runners", flo.GroupOptions{})
	require.NoError(t, err)
	ids := appendN(t, c, "jobs", 50, 50)

	// A consumer speaking the raw protocol takes a batch and dies holding it.
	conn := dial(t, e.stack.GatewayGRPCAddr())
	streamCtx, kill := context.WithCancel(ctx)
	ws, err := flov1.NewWorkerServiceClient(conn).Stream(streamCtx)
	require.NoError(t, err)
	require.NoError(t, ws.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{
		WorkerId: "doomed", Namespace: "default",
		Streams: []*flov1.StreamSubscription{{Stream: "jobs", Group: "runners", Consumer: "doomed"}},
	}}}))
	_, err = ws.Recv() // HelloAck
	require.NoError(t, err)
	require.NoError(t, ws.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamRead{StreamRead: &flov1.StreamRead{
		Stream: "jobs", Group: "runners", Consumer: "doomed", Count: 10, BlockMs: 5000, MessageTimeoutMs: 1500,
	}}}))
	msg, err := ws.Recv()
	require.NoError(t, err)
	taken := msg.GetRecordBatch().GetRecords()
	require.Len(t, taken, 10)
	kill()

	pending, total, err := c.ListPending(ctx, "jobs", "runners", flo.PendingOptions{Consumer: "doomed"})
	require.NoError(t, err)
	require.Equal(t, int64(10), total, "the dead consumer's records stay pending until their timeout")
	require.Len(t, pending, 10)

	got := newHandled()
	var mu sync.Mutex
	deliveryOf := map[string]int{}
	e.streamWorker(t, flo.StreamWorkerOptions{Stream: "jobs", Group: "runners", Consumer: "survivor", BatchSize: 20},
		func(sctx *flo.StreamContext) error {
			mu.Lock()
			deliveryOf[sctx.StreamID()] = sctx.DeliveryCount()
			mu.Unlock()
			if sctx.Consumer() != "survivor" {
				t.Errorf("consumer %q, want survivor", sctx.Consumer())
			}
			got.add(sctx.StreamID())
			return nil
		})
	got.requireEachOnce(t, ids, time.Minute)
	requireSettled(t, c, "jobs", "runners")
	mu.Lock()
	defer mu.Unlock()
	for _, r := range taken {
		require.Equal(t, 2, deliveryOf[r.GetId()], "record %s was redelivered, not first delivered, to the survivor", r.GetId())
	}
}

// consumeThroughFault appends n records while a worker consumes them and runs
// fault once a third are handled; every record must be handled exactly once.
func consumeThroughFault(t *testing.T, e *env, n int, fault func()) {
	t.Helper()
	c := e.client(t, "default")
	ctx := context.Background()
	_, err := c.CreateStream(ctx, "feed", flo.StreamOptions{Partitions: 4})
	require.NoError(t, err)
	got := newHandled()
	e.streamWorker(t, flo.StreamWorkerOptions{Stream: "feed", Group: "g", Concurrency: 32, BatchSize: 100, MessageTimeout: 3 * time.Second},
		func(sctx *flo.StreamContext) error {
			got.add(sctx.StreamID())
			return nil
		})
	ids := appendN(t, c, "feed", n, 500)
	require.Eventually(t, func() bool { return got.total.Load() >= int64(n/3) }, time.Minute, 10*time.Millisecond)
	fault()
	got.requireEachOnce(t, ids, 2*time.Minute)
	requireSettled(t, c, "feed", "g")
}

func TestStreamsServiceRestartMidConsumptionLosesAndRepeatsNothing(t *testing.T) {
	e := newEnv(t)
	consumeThroughFault(t, e, 20_000, func() {
		require.NoError(t, e.stack.StopStreams())
		require.NoError(t, e.stack.StartStreams(context.Background()))
	})
}

func TestBrokerRestartMidConsumptionLosesAndRepeatsNothing(t *testing.T) {
	e := newEnv(t)
	consumeThroughFault(t, e, 20_000, func() {
		require.NoError(t, e.broker.Restart())
	})
}
