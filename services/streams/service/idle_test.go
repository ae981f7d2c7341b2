package service_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestIdleGroupReads has many consumers of one group long-poll while
// nothing happens, as idle stream workers do: the safety tick probes one of
// them per tick instead of waking them all, new reads of a group whose last
// look found nothing wait without a transaction, and yet a record nacked on
// another replica (a wake-up this replica never gets) and a record appended
// both reach a waiting consumer.
func TestIdleGroupReads(t *testing.T) {
	e := newEnv(t)
	r := e.start(t, e.config())
	other := e.start(t, e.config())
	c := r.client
	ns := namespace()
	createStream(t, c, ns, "s", 2)
	createGroup(t, c, ns, "s", "g", "$", 0)

	// A record held by a consumer of the other replica for an hour: the
	// waiting reads here know it comes due then.
	nacked := appendN(t, c, ns, "s", 0, 1)[0]
	held := groupRead(t, other.client, ns, "s", "g", "x", 1, 0, time.Hour)
	require.Equal(t, []string{nacked}, ids(held))

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan string, 1000)
	read := func(consumer string) {
		resp, err := c.GroupRead(ctx, &flov1.GroupReadRequest{
			Namespace: ns, Stream: "s", Group: "g", Consumer: consumer, Count: 1, BlockMs: time.Minute.Milliseconds(),
		})
		if err == nil {
			for _, rec := range resp.GetRecords() {
				got <- rec.GetId()
			}
		}
	}
	const readers = 500
	for i := range readers {
		go read(fmt.Sprintf("c%d", i))
	}
	t.Cleanup(cancel)
	require.Eventually(t, func() bool { return r.svc.Waiters() == readers }, waitFor, tick)

	// Once the reads have looked (a tick is plenty), two safety ticks: a
	// few looks, not one per waiting read per tick.
	probes := r.svc.Probes()
	require.Eventually(t, func() bool { return r.svc.Probes() > probes }, waitFor, tick)
	looks := lookCounter(r)
	probes = r.svc.Probes()
	require.Eventually(t, func() bool { return r.svc.Probes() >= probes+2 }, waitFor, tick)
	looks(t, 10, "over two safety ticks with %d waiting reads", readers)

	// Consumers renewing their long polls one after another: the group's
	// last look still holds, so they wait without looking.
	looks = lookCounter(r)
	for i := range 100 {
		go read(fmt.Sprintf("d%d", i))
		require.Eventually(t, func() bool { return r.svc.Waiters() == readers+i+1 }, waitFor, time.Millisecond)
	}
	looks(t, 10, "for 100 new waiting reads")

	// Nacked on the other replica, the record is due at once, and nothing
	// tells this replica: the next probe finds it.
	_, err := other.client.Nack(t.Context(), &flov1.NackRequest{Namespace: ns, Stream: "s", Group: "g", Ids: []string{nacked}})
	require.NoError(t, err)
	requireGot(t, got, nacked)

	// An append wakes every waiting read; once one took the record and a
	// transaction found nothing left, the others need not look.
	looks = lookCounter(r)
	appended := appendN(t, c, ns, "s", 1, 1)[0]
	requireGot(t, got, appended)
	probes = r.svc.Probes()
	require.Eventually(t, func() bool { return r.svc.Probes() >= probes+2 }, waitFor, tick)
	looks(t, 3*64, "after an append woke %d waiting reads", readers+100-1)
}

// lookCounter notes the read transactions of r so far and returns a check
// that at most limit reads looked (in however many transactions) since.
func lookCounter(r *replica) func(t *testing.T, limit int64, msg string, args ...any) {
	txs, reads := r.svc.ReadTransactions()
	return func(t *testing.T, limit int64, msg string, args ...any) {
		t.Helper()
		txsNow, readsNow := r.svc.ReadTransactions()
		what := fmt.Sprintf(msg, args...)
		require.LessOrEqual(t, readsNow-reads, limit, "reads looked %s", what)
		require.LessOrEqual(t, txsNow-txs, limit, "read transactions %s", what)
	}
}

// requireGot waits for a waiting read to return id.
func requireGot(t *testing.T, got <-chan string, id string) {
	t.Helper()
	select {
	case g := <-got:
		require.Equal(t, id, g)
	case <-time.After(waitFor):
		t.Fatalf("no waiting read got %s", id)
	}
}
