package service_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestIdleStreamWorkersShareOneRead opens idle stream workers of one group
// and checks that their reads wait in one GroupReadMany on the streams
// service (counted by its handlers' goroutines, the stack running in this
// process), not a GroupRead each, and that records appended then reach
// several of them, each pending under the consumer that got it.
func TestIdleStreamWorkersShareOneRead(t *testing.T) {
	s := startStreamsStack(t, false)
	createStreamAndGroup(t, s, "events", "g")
	const n = 20
	workers := make([]*rawWorker, n)
	for i := range workers {
		workers[i] = openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: fmt.Sprintf("sw%d", i), Namespace: "default",
			Streams: []*flov1.StreamSubscription{{Stream: "events", Group: "g"}}})
		workers[i].streamRead(t, "events", "g", 2, 60_000)
	}
	var many, single int
	require.Eventually(t, func() bool {
		many, single = streamsReadHandlers()
		return many == 1 && single == 0
	}, wait, 10*time.Millisecond, "waiting GroupReadMany calls: %d, GroupRead calls: %d", &many, &single)
	for _, w := range workers {
		w.sync(t)
	}
	many, single = streamsReadHandlers()
	require.Equal(t, 1, many, "the idle workers' reads wait in one GroupReadMany")
	require.Zero(t, single)

	ids := appendN(t, s, "events", 10)
	got := map[string]string{} // record id -> worker id
	reached := map[string]bool{}
	received := 0
	require.Eventually(t, func() bool {
		for i, w := range workers {
			select {
			case m := <-w.msgs:
				for _, r := range m.GetRecordBatch().GetRecords() {
					received++
					got[r.GetId()] = fmt.Sprintf("sw%d", i)
					reached[got[r.GetId()]] = true
				}
			default:
			}
		}
		return received >= len(ids)
	}, wait, 10*time.Millisecond, "records received: %d of %d", &received, len(ids))
	require.Len(t, got, len(ids), "each record reached one worker")
	require.GreaterOrEqual(t, len(reached), 5, "2 records per read: 10 reach at least 5 workers")

	pending, err := s.streams.ListPending(testContext(t), &flov1.ListPendingRequest{Namespace: "default", Stream: "events", Group: "g"})
	require.NoError(t, err)
	require.Len(t, pending.GetEntries(), len(ids))
	for _, e := range pending.GetEntries() {
		require.Equal(t, got[e.GetId()], e.GetConsumer(), "a record is pending under the consumer that got it")
	}
}

// streamsReadHandlers counts the goroutines of the streams service serving
// a GroupReadMany and a GroupRead.
func streamsReadHandlers() (many, single int) {
	buf := make([]byte, 16<<20)
	for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		switch {
		case strings.Contains(g, "grpcapi.(*Server).GroupReadMany("):
			many++
		case strings.Contains(g, "grpcapi.(*Server).GroupRead("):
			single++
		}
	}
	return many, single
}
