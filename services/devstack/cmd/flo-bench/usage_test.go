package main

import (
	"context"
	"os"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// The Postgres figures of the sustained mode come from the server itself: its
// processes' CPU grows with a backend's work and its commit count with a
// commit.
func TestPostgresUsageCountsTheServersWork(t *testing.T) {
	ctx := t.Context()
	db, err := pgx.Connect(ctx, harness.NewDatabase(t))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close(context.Background()) })

	pid, err := postmaster(ctx, db)
	require.NoError(t, err)
	require.NotZero(t, pid, "the test's Postgres runs on this machine")
	cpu, err := postgresCPU(pid)
	require.NoError(t, err)
	n, err := commits(ctx, db)
	require.NoError(t, err)

	_, err = db.Exec(ctx, `CREATE TABLE t AS SELECT count(*) FROM generate_series(1, 3000000)`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	require.NoError(t, err)

	after, err := postgresCPU(pid)
	require.NoError(t, err)
	require.Greater(t, after, cpu, "the backend's CPU is counted")
	require.Eventually(t, func() bool {
		m, err := commits(ctx, db)
		require.NoError(t, err)
		return m > n
	}, 10*time.Second, 20*time.Millisecond, "the commit is counted")
}

// A replica's CPU is what the profile samples of goroutines carrying its
// label add up to, the goroutines it started included.
func TestCPUByLabelChargesLabelledGoroutines(t *testing.T) {
	stop, err := recordProfile()
	require.NoError(t, err)
	start, err := processCPU()
	require.NoError(t, err)
	done := make(chan struct{})
	pprof.Do(t.Context(), pprof.Labels(replicaLabel, "2"), func(context.Context) {
		// Spawned under the label, as a replica's goroutines are.
		go func() {
			defer close(done)
			for {
				used, err := processCPU()
				if err != nil || used-start > 300*time.Millisecond {
					return
				}
			}
		}()
	})
	<-done
	by, err := cpuByLabel(stop(), replicaLabel)
	require.NoError(t, err)
	require.Positive(t, by["2"])
	require.Len(t, by, 1, "only labelled samples are counted")
}
