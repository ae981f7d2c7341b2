package devstack_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
)

// newStreamEnv starts a platform with a stream of two partitions in the
// default namespace and returns a client of it.
func newStreamEnv(t *testing.T, stream string) (*env, *flo.Client) {
	t.Helper()
	e := newEnv(t)
	c := e.client(t, "default")
	_, err := c.CreateStream(context.Background(), stream, flo.StreamOptions{Partitions: 2})
	require.NoError(t, err)
	return e, c
}

// TestKeySharedStreamWorkersKeepEachKeyInOrder runs two stream workers, each
// handling records concurrently, on a key_shared group: each key's records
// are handled in append order, never two at once, and the keys spread over
// both workers.
func TestKeySharedStreamWorkersKeepEachKeyInOrder(t *testing.T) {
	e, c := newStreamEnv(t, "orders")
	ctx := context.Background()
	const (
		keys   = 8
		rounds = 5
		per    = 10
		total  = keys * rounds * per
	)
	for r := range rounds {
		for k := range keys {
			payloads := make([]any, per)
			for i := range payloads {
				payloads[i] = map[string]int{"seq": r*per + i}
			}
			_, err := c.AppendMany(ctx, "orders", payloads, flo.WithKey(fmt.Sprintf("k%d", k)))
			require.NoError(t, err)
		}
	}

	var (
		mu       sync.Mutex
		busy     = map[string]bool{}
		next     = map[string]int{}
		problems []string
		done     atomic.Int64
	)
	perWorker := make([]atomic.Int64, 2)
	for w := range perWorker {
		e.streamWorker(t, flo.StreamWorkerOptions{Stream: "orders", Group: "ordered", GroupMode: flo.GroupKeyShared, Concurrency: 16, BatchSize: 8},
			func(sctx *flo.StreamContext) error {
				var ev struct{ Seq int }
				if err := sctx.Into(&ev); err != nil {
					return err
				}
				k := sctx.Key()
				mu.Lock()
				if busy[k] {
					problems = append(problems, fmt.Sprintf("%s seq %d handled while another of its records was", k, ev.Seq))
				}
				if ev.Seq != next[k] {
					problems = append(problems, fmt.Sprintf("%s seq %d handled, want %d", k, ev.Seq, next[k]))
				}
				busy[k] = true
				mu.Unlock()
				runtime.Gosched() // let another handler of the key, if any, run into it
				mu.Lock()
				busy[k] = false
				next[k] = ev.Seq + 1
				mu.Unlock()
				perWorker[w].Add(1)
				done.Add(1)
				return nil
			})
	}
	require.Eventually(t, func() bool { return done.Load() >= total }, 2*time.Minute, 20*time.Millisecond,
		"handled %d of %d", done.Load(), total)
	requireSettled(t, c, "orders", "ordered")
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, problems)
	require.EqualValues(t, total, done.Load())
	for w := range perWorker {
		require.Positive(t, perWorker[w].Load(), "worker %d handled nothing: keys did not spread", w)
	}
}

// TestExclusiveStreamWorkerFailsOver runs two stream workers on an exclusive
// group: only the first to read gets records; when it stops, the other takes
// the group over once the first's lease (message timeout plus block time)
// ran out, and every record is handled.
func TestExclusiveStreamWorkerFailsOver(t *testing.T) {
	e, c := newStreamEnv(t, "ledger")
	ctx := context.Background()
	_, err := c.CreateGroup(ctx, "ledger", "book", flo.GroupOptions{Mode: flo.GroupExclusive})
	require.NoError(t, err)

	opts := flo.StreamWorkerOptions{Stream: "ledger", Group: "book", GroupMode: flo.GroupExclusive, BlockMS: 200, MessageTimeout: time.Second}
	var first, second atomic.Int64
	h := newHandled()
	optsA := opts
	optsA.Consumer = "a"
	stopA := e.streamWorker(t, optsA, func(sctx *flo.StreamContext) error {
		h.add(sctx.StreamID())
		first.Add(1)
		return nil
	})
	ids := appendN(t, c, "ledger", 100, 10)
	require.Eventually(t, func() bool { return first.Load() == 100 }, time.Minute, 10*time.Millisecond)

	optsB := opts
	optsB.Consumer = "b"
	e.streamWorker(t, optsB, func(sctx *flo.StreamContext) error {
		h.add(sctx.StreamID())
		second.Add(1)
		return nil
	})
	more := appendN(t, c, "ledger", 100, 10)
	require.Eventually(t, func() bool { return first.Load() == 200 }, time.Minute, 10*time.Millisecond,
		"a holds the group and handles what is appended")
	require.Zero(t, second.Load(), "b got records while a held the group")

	stopA()
	rest := appendN(t, c, "ledger", 100, 10)
	h.requireEachOnce(t, append(append(ids, more...), rest...), time.Minute)
	require.EqualValues(t, 100, second.Load(), "b took the group over")
	requireSettled(t, c, "ledger", "book")
}
