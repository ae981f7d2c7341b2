package sweep_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/sweep"
)

func TestBatches(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	tests := []struct {
		name    string
		sizes   []int // what each call handles
		failAt  int   // 1-based call that fails, 0 for none
		total   int
		calls   int
		wantErr error
	}{
		{name: "nothing due", sizes: []int{0}, total: 0, calls: 1},
		{name: "one short batch", sizes: []int{3}, total: 3, calls: 1},
		{name: "full batches then short", sizes: []int{5, 5, 2}, total: 12, calls: 3},
		{name: "full batches then empty", sizes: []int{5, 5, 0}, total: 10, calls: 3},
		{name: "failure stops", sizes: []int{5, 5, 5}, failAt: 2, total: 5, calls: 2, wantErr: boom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			total, err := sweep.Batches(context.Background(), 5, func(context.Context) (int, error) {
				calls++
				if calls == tt.failAt {
					return 0, boom
				}
				return tt.sizes[calls-1], nil
			})
			require.ErrorIs(t, err, tt.wantErr)
			require.Equal(t, tt.total, total)
			require.Equal(t, tt.calls, calls)
		})
	}
}

func TestEveryRunsUntilCanceledAndLogsFailures(t *testing.T) {
	t.Parallel()
	var logs harness.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	var runs atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- sweep.Every(ctx, 10*time.Millisecond, log, "expire things", func(context.Context) (int, error) {
			if runs.Add(1) == 1 {
				return 0, errors.New("database down")
			}
			return 1, nil
		})
	}()
	require.Eventually(t, func() bool { return runs.Load() >= 3 }, 5*time.Second, 5*time.Millisecond,
		"a failed run does not stop the loop")
	cancel()
	require.NoError(t, <-done)
	require.Contains(t, logs.String(), `msg="expire things" error="database down"`)
	require.Equal(t, 1, strings.Count(logs.String(), "expire things"), "only the failure is logged")
}
