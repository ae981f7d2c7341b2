package wake_test

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/wake"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

func TestListenerDeliversNotifications(t *testing.T) {
	t.Parallel()
	url := harness.NewDatabase(t)
	got := make(chan string, 10)
	var (
		mu          sync.Mutex
		connections int
	)
	connect := func(ctx context.Context) (*pgx.Conn, error) {
		mu.Lock()
		connections++
		mu.Unlock()
		return pgx.Connect(ctx, url)
	}
	reconnected := make(chan struct{}, 10)
	l := wake.NewListener(connect, map[string]func(string){
		"chan_a": func(p string) { got <- "a:" + p },
	}, func() { reconnected <- struct{}{} }, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	sender, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer sender.Close(context.Background())

	// Notify until one arrives: the listener may not be listening yet.
	notifyUntil := func(payload string) {
		require.Eventually(t, func() bool {
			_, err := sender.Exec(t.Context(), `SELECT pg_notify('chan_a', $1)`, payload)
			require.NoError(t, err)
			select {
			case p := <-got:
				require.Equal(t, "a:"+payload, p)
				return true
			case <-t.Context().Done():
				return false
			default:
				return false
			}
		}, waitFor, 20*time.Millisecond)
	}
	notifyUntil("ns/x")

	// Kill the listener's connection: it reconnects, says so, and listens again.
	_, err = sender.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	require.NoError(t, err)
	select {
	case <-reconnected:
	case <-t.Context().Done():
		t.Fatal("listener did not reconnect")
	}
	for len(got) > 0 {
		<-got
	}
	notifyUntil("ns/y")
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, connections, 2)
}
