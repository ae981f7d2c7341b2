package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// The workers mode shares its workers over load processes that each hold at
// most 5,000 unless told how many processes to use, and never starts an empty
// one.
func TestSplitWorkers(t *testing.T) {
	tests := []struct {
		name           string
		workers, procs int
		want           []int
	}{
		{name: "one process", workers: 200, want: []int{200}},
		{name: "exactly full", workers: 10000, want: []int{5000, 5000}},
		{name: "one more", workers: 10001, want: []int{3334, 3334, 3333}},
		{name: "as asked", workers: 10, procs: 3, want: []int{4, 3, 3}},
		{name: "more processes than workers", workers: 2, procs: 5, want: []int{1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, splitWorkers(tt.workers, tt.procs))
		})
	}
}

func TestVMRSSReadsTheStatusFile(t *testing.T) {
	rss, err := vmRSS([]byte("Name:\tflo-bench\nVmHWM:\t  600000 kB\nVmRSS:\t  577000 kB\nThreads:\t12\n"))
	require.NoError(t, err)
	require.Equal(t, int64(577000<<10), rss)

	_, err = vmRSS([]byte("Name:\tkthreadd\n"))
	require.ErrorContains(t, err, "no VmRSS")

	data, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	rss, err = vmRSS(data)
	require.NoError(t, err)
	require.Positive(t, rss, "this test's own memory")
}

func TestParseReport(t *testing.T) {
	kind, id, text := parseReport("warn idle-7 flo: worker registry unreachable error=deadline exceeded")
	require.Equal(t, []string{reportWarn, "idle-7", "flo: worker registry unreachable error=deadline exceeded"}, []string{kind, id, text})
	kind, id, text = parseReport("connected idle-12")
	require.Equal(t, []string{reportConnected, "idle-12", ""}, []string{kind, id, text})
}

// Worker warnings that differ only in numbers (attempts, delays) are one
// kind, so a storm's hundreds print as a few lines with counts.
func TestWarnKindLeavesNumbersOut(t *testing.T) {
	a := warnKind(`flo: worker stream down; reconnecting error=rpc error: code = DeadlineExceeded retry_in=1.2s attempts=1`)
	b := warnKind(`flo: worker stream down; reconnecting error=rpc error: code = DeadlineExceeded retry_in=850ms attempts=12`)
	require.Equal(t, a, b)
	require.Equal(t, "flo: worker stream down; reconnecting error=rpc error: code = DeadlineExceeded retry_in=# attempts=#", a)
	require.NotEqual(t, a, warnKind(`flo: heartbeat failed; retrying with the next one error=EOF failures=1`))
}

func TestRequestsPerListsTheCostliestFirst(t *testing.T) {
	got := requestsPer(map[string]int64{"Fetch": 3000, "Produce": 5000, "EndTxn": 3000, "Heartbeat": 5}, 1000)
	require.Equal(t, "Produce 5.00, EndTxn 3.00, Fetch 3.00", got, "ties by name, below 0.01 per task left out")
	require.Empty(t, requestsPer(map[string]int64{"Fetch": 1}, 0))
}
