package service_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// BenchmarkCycle measures the dispatcher's full task cycle: invocations on
// the commands topic, claims by 16 concurrent workers (50 tasks each) and
// their completions. b.N is the number of tasks.
func BenchmarkCycle(b *testing.B) {
	broker := harness.NewBroker(b)
	dbURL := harness.NewDatabase(b)
	r := startReplica(b, dbURL, broker.Addrs())
	_, err := r.client.RegisterAction(b.Context(), &flov1.RegisterActionRequest{Namespace: "default", Name: "bench"})
	require.NoError(b, err)
	producer := newProducer(b, broker.Addrs())

	b.ResetTimer()
	start := time.Now()
	go func() {
		for left := b.N; left > 0; left -= 1000 {
			produceMany(b, producer, "default", "bench", min(left, 1000))
		}
	}()
	var done atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			worker := uuid.NewString()
			for done.Load() < int64(b.N) {
				resp, err := r.client.Claim(b.Context(), &dispatcherv1.ClaimRequest{Namespace: "default", Slots: []*dispatcherv1.ClaimSlot{{WorkerId: worker, Count: 50}}, Actions: []string{"bench"}, WaitMs: 100})
				if err != nil {
					b.Errorf("claim: %v", err)
					return
				}
				if len(resp.GetTasks()) == 0 {
					continue
				}
				reports := make([]*dispatcherv1.Report, len(resp.GetTasks()))
				for i, a := range resp.GetTasks() {
					reports[i] = completed(a, `{"ok":true}`, "")
				}
				if _, err := r.client.Report(b.Context(), &dispatcherv1.ReportRequest{Namespace: "default", WorkerId: worker, Reports: reports}); err != nil {
					b.Errorf("report: %v", err)
					return
				}
				done.Add(int64(len(reports)))
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
}
