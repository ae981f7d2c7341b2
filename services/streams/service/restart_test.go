package service_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// ledger checks the group guarantees across restarts: every record acked,
// none handed out again after its ack.
type ledger struct {
	t         *testing.T
	mu        sync.Mutex
	acked     map[string]bool
	delivered map[string][]int32 // delivery counts seen per id
}

func newLedger(t *testing.T) *ledger {
	return &ledger{t: t, acked: map[string]bool{}, delivered: map[string][]int32{}}
}

func (l *ledger) saw(recs []*flov1.StreamRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range recs {
		if l.acked[r.GetId()] {
			l.t.Errorf("record %s handed out again after its ack", r.GetId())
		}
		l.delivered[r.GetId()] = append(l.delivered[r.GetId()], r.GetDeliveryCount())
	}
}

func (l *ledger) ack(ids []string, acked int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if int(acked) != len(ids) {
		l.t.Errorf("acked %d of %d records just handed out", acked, len(ids))
	}
	for _, id := range ids {
		l.acked[id] = true
	}
}

func (l *ledger) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// transient reports whether an error is one a client retries.
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// consume reads and acks as consumer until the ledger has want records
// acked, retrying transient errors.
func consume(t *testing.T, c streamsv1.StreamsClient, l *ledger, ns, stream, group, consumer string, want int, timeout time.Duration) {
	deadline := time.Now().Add(waitFor)
	for l.ackedCount() < want {
		if time.Now().After(deadline) {
			t.Errorf("%s: only %d of %d records acked", consumer, l.ackedCount(), want)
			return
		}
		resp, err := c.GroupRead(context.Background(), &flov1.GroupReadRequest{
			Namespace: ns, Stream: stream, Group: group, Consumer: consumer, Count: 25,
			BlockMs: 200, MessageTimeoutMs: timeout.Milliseconds(),
		})
		if transient(err) {
			continue
		}
		if err != nil {
			t.Errorf("%s: group read: %v", consumer, err)
			return
		}
		l.saw(resp.GetRecords())
		if len(resp.GetRecords()) == 0 {
			continue
		}
		batch := ids(resp.GetRecords())
		for {
			a, err := c.Ack(context.Background(), &flov1.AckRequest{Namespace: ns, Stream: stream, Group: group, Ids: batch})
			if transient(err) {
				continue
			}
			if err != nil {
				t.Errorf("%s: ack: %v", consumer, err)
				return
			}
			l.ack(batch, a.GetAcked())
			break
		}
	}
}

func TestServiceRestartMidConsumption(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first := e.start(t, e.config())
	ns := namespace()
	createStream(t, first.client, ns, "s", 2)
	createGroup(t, first.client, ns, "s", "g", "-", 0)
	appended := appendN(t, first.client, ns, "s", 0, 400)

	// The first replica acks 150 records, then hands out 50 more that its
	// consumer never acks before the replica goes away.
	l := newLedger(t)
	consume(t, first.client, l, ns, "s", "g", "c1", 150, 300*time.Millisecond)
	inFlight := groupRead(t, first.client, ns, "s", "g", "c1", 50, 0, 300*time.Millisecond)
	require.Len(t, inFlight, 50)
	l.saw(inFlight)
	first.stop()

	// A new replica on the same database and broker: the rest, and the
	// in-flight records once their timeout passed, each acked once.
	second := e.start(t, e.config())
	consume(t, second.client, l, ns, "s", "g", "c2", len(appended), time.Minute)
	require.Equal(t, len(appended), l.ackedCount())
	for _, id := range appended {
		require.True(t, l.acked[id], "record %s lost", id)
	}
	for _, r := range inFlight {
		require.Equal(t, []int32{1, 2}, l.delivered[r.GetId()], "an unacked record is redelivered once")
	}
	redelivered := 0
	for _, counts := range l.delivered {
		if len(counts) > 1 {
			redelivered++
		}
	}
	require.Equal(t, len(inFlight), redelivered, "only unacked records are redelivered")

	info, err := second.client.GetStream(t.Context(), &flov1.GetStreamRequest{Namespace: ns, Stream: "s"})
	require.NoError(t, err)
	require.Zero(t, info.GetGroups()[0].GetLag())
	require.Zero(t, info.GetGroups()[0].GetPending())
}

func TestBrokerRestartMidConsumption(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start(t, e.config())
	c := r.client
	ns := namespace()
	createStream(t, c, ns, "s", 3)
	createGroup(t, c, ns, "s", "g", "-", 0)
	appended := appendN(t, c, ns, "s", 0, 300)

	l := newLedger(t)
	consume(t, c, l, ns, "s", "g", "c1", 100, time.Minute)

	// Restart the broker while two consumers work through the rest and
	// more records are appended.
	const total = 600
	var wg sync.WaitGroup
	for _, name := range []string{"c2", "c3"} {
		wg.Go(func() { consume(t, c, l, ns, "s", "g", name, total, time.Minute) })
	}
	require.NoError(t, e.broker.Restart())
	for len(appended) < total {
		resp, err := c.Append(t.Context(), &flov1.AppendRequest{Namespace: ns, Stream: "s", Records: records(len(appended), 100)})
		if transient(err) {
			continue
		}
		require.NoError(t, err)
		appended = append(appended, resp.GetIds()...)
	}
	wg.Wait()
	require.Equal(t, total, l.ackedCount())
	for _, id := range appended {
		require.True(t, l.acked[id], "record %s lost", id)
	}
	all, err := c.Read(t.Context(), &flov1.ReadRequest{Namespace: ns, Stream: "s", Count: total})
	require.NoError(t, err)
	require.ElementsMatch(t, appended, ids(all.GetRecords()), "the log holds every record once")
}

func records(from, n int) []*flov1.AppendRecord {
	out := make([]*flov1.AppendRecord, n)
	for i := range out {
		out[i] = &flov1.AppendRecord{Payload: []byte(`{"n":` + strconv.Itoa(from+i) + `}`)}
	}
	return out
}
