package flo

import (
	"testing"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// A stream worker keeps one read outstanding, asks for no more than its free slots and its
// batch size, and asks again only once every record of the answer has a slot.
func TestSlotsKeepOneReadOutstanding(t *testing.T) {
	t.Parallel()
	s := &slots{size: 4}
	require.Equal(t, 3, s.grantRead(3), "the batch size bounds a read")
	require.Zero(t, s.grantRead(3), "one read at a time")

	s.answer(2)
	require.Zero(t, s.grantRead(3), "the answer's records have no slots yet")
	require.True(t, s.acquire())
	require.Zero(t, s.grantRead(3))
	require.True(t, s.acquire())
	require.Equal(t, 2, s.grantRead(3), "two slots busy, two free")

	s.answer(0)
	require.Equal(t, 2, s.grantRead(3), "an empty answer frees the read")
	s.answer(1)
	s.consume() // a record handed back by a stopping worker
	s.release()
	s.release()
	require.Equal(t, 3, s.grantRead(3))
	s.reset()
	require.Equal(t, 3, s.grantRead(3), "a read dies with its stream")
}

func TestStreamWorkerPacksAcksAndNacks(t *testing.T) {
	t.Parallel()
	w := &StreamWorker{opts: StreamWorkerOptions{Stream: "events", Group: "g"}}
	queued := []*flov1.WorkerMessage{
		w.ack("1-0"),
		w.nack("1-1", 0, "db down"),
		w.ack("1-2"),
		w.nack("1-3", 0, "db down"),
		w.nack("1-4", 0, "panic: boom"),
		w.ack("1-5"),
		{Msg: &flov1.WorkerMessage_StreamAck{StreamAck: &flov1.StreamAck{Stream: "other", Group: "g", Ids: []string{"9-0"}}}},
	}
	got := w.pack(queued)
	want := []*flov1.WorkerMessage{
		{Msg: &flov1.WorkerMessage_StreamAck{StreamAck: &flov1.StreamAck{Stream: "events", Group: "g", Ids: []string{"1-0", "1-2", "1-5"}}}},
		{Msg: &flov1.WorkerMessage_StreamNack{StreamNack: &flov1.StreamNack{Stream: "events", Group: "g", Ids: []string{"1-1", "1-3"}, Reason: "db down"}}},
		{Msg: &flov1.WorkerMessage_StreamNack{StreamNack: &flov1.StreamNack{Stream: "events", Group: "g", Ids: []string{"1-4"}, Reason: "panic: boom"}}},
		{Msg: &flov1.WorkerMessage_StreamAck{StreamAck: &flov1.StreamAck{Stream: "other", Group: "g", Ids: []string{"9-0"}}}},
	}
	require.Len(t, got, len(want))
	for i := range want {
		require.True(t, proto.Equal(want[i], got[i]), "message %d: want %v, got %v", i, want[i], got[i])
	}
	require.Equal(t, []string{"1-0"}, queued[0].GetStreamAck().GetIds(), "the queued messages are left as they were")

	// What a broken stream did not take is packed again with what came since.
	again := w.pack(append(got[:1:1], w.ack("1-6")))
	require.Len(t, again, 1)
	require.Equal(t, []string{"1-0", "1-2", "1-5", "1-6"}, again[0].GetStreamAck().GetIds())
}
