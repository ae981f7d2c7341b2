package workerstream

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func TestHelloStreamsDefaultsAndDeduplicates(t *testing.T) {
	subs, err := helloStreams([]*flov1.StreamSubscription{
		{Stream: "events"},
		{Stream: "events", Group: "default"},
		{Stream: "events", Group: "audit", Consumer: "c1"},
	}, "w1")
	require.NoError(t, err)
	require.Equal(t, []string{"events/audit", "events/default"}, subscriptionNames(subs))
	require.Equal(t, "w1", subs["events/default"].consumer)
	require.Equal(t, "c1", subs["events/audit"].consumer)
}

func TestHelloStreamsRefusals(t *testing.T) {
	tests := []struct {
		name string
		in   []*flov1.StreamSubscription
	}{
		{name: "no stream", in: []*flov1.StreamSubscription{{Group: "g"}}},
		{name: "bad group", in: []*flov1.StreamSubscription{{Stream: "s", Group: ".g"}}},
		{name: "bad consumer", in: []*flov1.StreamSubscription{{Stream: "s", Consumer: "a b"}}},
		{name: "two consumers", in: []*flov1.StreamSubscription{{Stream: "s", Consumer: "a"}, {Stream: "s", Consumer: "b"}}},
		{name: "too many", in: func() []*flov1.StreamSubscription {
			out := make([]*flov1.StreamSubscription, maxSubscriptions+1)
			for i := range out {
				out[i] = &flov1.StreamSubscription{Stream: "s", Group: "g" + string(rune('a'+i%26)) + string(rune('a'+i/26))}
			}
			return out
		}()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helloStreams(tc.in, "w1")
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		})
	}
}

func TestHeldRecordsExpire(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newHeldRecords()
	emptied := h.emptied()
	h.add(&delivery{stream: "s", group: "g", ids: []string{"1-0", "1-1"}, timeout: time.Minute}, now)
	h.add(&delivery{stream: "s", group: "other", ids: []string{"1-0", "1-2"}, timeout: time.Hour}, now)
	require.Equal(t, 4, h.len(now))
	require.True(t, h.has(recordKey("s", "other", "1-2")))

	h.remove("s", "g", []string{"1-0"})
	require.Equal(t, 3, h.len(now))
	require.Equal(t, 2, h.len(now.Add(time.Minute+recordGrace+time.Second)), "a record past its message timeout no longer counts")

	h.remove("s", "other", []string{"1-0", "1-2"})
	select {
	case <-emptied:
	default:
		require.Fail(t, "emptying the set signals")
	}
}

func TestAReadIsCutToTheRoomForHeldRecords(t *testing.T) {
	srv := NewServer(nil, Options{})
	s := &session{
		srv: srv, ctx: t.Context(), records: newHeldRecords(),
		subs: map[string]*subscription{"s/default": {stream: "s", group: defaultGroup, consumer: "w1"}},
	}
	sent := make(chan outgoing, 1)
	s.out.init(1, func(item outgoing) { sent <- item })
	now := time.Now()
	ids := make([]string, maxHeldRecords-3)
	for i := range ids {
		ids[i] = fmt.Sprintf("1-%d", i)
	}
	s.records.add(&delivery{stream: "s", group: defaultGroup, ids: ids, timeout: time.Hour}, now)
	s.subs["s/default"].reads = []*readCall{{req: &flov1.GroupReadRequest{Count: 3}}}
	require.Equal(t, 3, s.outstandingLocked())

	require.NoError(t, s.streamRead(&flov1.StreamRead{Stream: "s", Count: 10}))
	item := <-sent
	require.Empty(t, item.msg.GetRecordBatch().GetRecords(), "with every place taken the read is answered empty at once")
	require.Len(t, s.subs["s/default"].reads, 1, "and nothing was asked of the streams service")
}
