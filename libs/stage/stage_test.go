package stage_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/stage"
)

const waitFor = 10 * time.Second

// journal records what happened, in order.
type journal struct {
	mu      sync.Mutex
	entries []string
}

func (j *journal) add(e string) {
	j.mu.Lock()
	j.entries = append(j.entries, e)
	j.mu.Unlock()
}

func (j *journal) list() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.entries...)
}

// worker is a component that runs until its context ends and notes its exit.
func worker(j *journal, name string, started *sync.WaitGroup) func(context.Context) error {
	started.Add(1)
	return func(ctx context.Context) error {
		started.Done()
		<-ctx.Done()
		j.add(name + " exited")
		return nil
	}
}

func TestStagesStopInReverseOrder(t *testing.T) {
	t.Parallel()
	var (
		j       journal
		started sync.WaitGroup
	)
	stages := []*stage.Stage{
		stage.New("first").Go("a", worker(&j, "a", &started)).OnStop(func(context.Context) { j.add("first stopping") }),
		stage.New("second").Go("b", worker(&j, "b", &started)).Go("c", worker(&j, "c", &started)),
		stage.New("third").OnStop(func(context.Context) { j.add("third stopping") }),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- stage.Run(ctx, nil, stages...) }()
	started.Wait()
	require.Empty(t, j.list(), "nothing stops while the context lives")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("Run did not return")
	}
	got := j.list()
	require.Len(t, got, 5)
	require.Equal(t, "third stopping", got[0])
	require.ElementsMatch(t, []string{"b exited", "c exited"}, got[1:3])
	require.Equal(t, []string{"first stopping", "a exited"}, got[3:])
}

func TestFailingComponentStopsEverything(t *testing.T) {
	t.Parallel()
	var (
		j       journal
		started sync.WaitGroup
	)
	boom := errors.New("boom")
	err := stage.Run(context.Background(), nil,
		stage.New("work").Go("steady", worker(&j, "steady", &started)),
		stage.New("failing").Go("broken", func(context.Context) error {
			started.Wait()
			return boom
		}),
	)
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "broken: boom")
	require.Equal(t, []string{"steady exited"}, j.list())
}

func TestServerStages(t *testing.T) {
	t.Parallel()
	httpLis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	grpcLis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("pong")) })
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- stage.Run(ctx, nil,
			stage.HTTP(httpSrv, httpLis, time.Second, nil),
			stage.GRPC(grpc.NewServer(), grpcLis, time.Second, nil),
		)
	}()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + httpLis.Addr().String() + "/ping")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, waitFor, 10*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("Run did not return")
	}
	_, err = http.Get("http://" + httpLis.Addr().String() + "/ping")
	require.Error(t, err, "the HTTP server is closed")
}

func TestReadinessGoesOffBeforeAnythingStops(t *testing.T) {
	t.Parallel()
	var (
		j       journal
		started sync.WaitGroup
	)
	// The delay is long enough for the check below to see everything still
	// running after readiness went off; no timing is asserted.
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- stage.Run(ctx, nil,
			stage.New("work").Go("work", worker(&j, "work", &started)),
			stage.Readiness(500*time.Millisecond, func() {
				j.add("readiness off")
				close(ready)
			}, nil),
		)
	}()
	started.Wait()
	cancel()
	<-ready
	require.Equal(t, []string{"readiness off"}, j.list(), "work keeps running while readiness is off")
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("Run did not return")
	}
	require.Equal(t, []string{"readiness off", "work exited"}, j.list())
}
