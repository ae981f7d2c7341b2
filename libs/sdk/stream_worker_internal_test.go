package flo

import (
	"testing"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// A stream worker asks for no more than its free slots and its batch size, keeps a further
// read outstanding only for a whole batch, and asks again after an answer only once every
// record of it has a slot.
func TestSlotsPipelineReads(t *testing.T) {
	t.Parallel()
	s := &slots{size: 10}
	require.Equal(t, 4, s.grantRead(4, 2), "the batch size bounds a read")
	require.Equal(t, 4, s.grantRead(4, 2), "a second whole batch fits")
	require.Zero(t, s.grantRead(4, 2), "at most two reads")

	s.answer(4)
	require.Zero(t, s.grantRead(4, 2), "the answer's records have no slots yet")
	for range 4 {
		require.True(t, s.acquire())
	}
	require.Zero(t, s.grantRead(4, 2), "a read is outstanding and only two slots are free")
	s.release()
	s.release()
	require.Equal(t, 4, s.grantRead(4, 2), "two slots busy, four promised, four free")

	s.answer(0)
	s.answer(0)
	require.Equal(t, 4, s.grantRead(4, 2), "empty answers free their reads")
	require.Equal(t, 4, s.grantRead(4, 2))
	s.answer(1)
	s.consume() // a record handed back by a stopping worker
	s.release()
	s.release()
	require.Equal(t, 4, s.grantRead(4, 2), "nothing busy, one read of four outstanding")
	s.reset()
	require.Equal(t, 3, s.grantRead(3, 1), "reads die with their stream")
	require.Zero(t, s.grantRead(3, 1), "one read at a time when maxReads is one")
}

// Answers may come in any order; while the reads they answer are not known, the books never
// promise the server fewer slots than it may still fill, and they are exact again once every
// read is answered.
func TestSlotsAnswersInAnyOrder(t *testing.T) {
	t.Parallel()
	s := &slots{size: 7}
	for range 4 {
		require.True(t, s.acquire())
	}
	require.Equal(t, 3, s.grantRead(4, 2), "three slots free: a short first read")
	for range 4 {
		s.release()
	}
	require.Equal(t, 4, s.grantRead(4, 2), "then a whole batch")

	s.answer(4) // the second read answered first
	for range 4 {
		require.True(t, s.acquire())
	}
	require.Zero(t, s.grantRead(4, 2), "taken as the read of three: four promised, so nothing is free")
	s.answer(3)
	for range 3 {
		require.True(t, s.acquire())
	}
	for range 7 {
		s.release()
	}
	require.Equal(t, 4, s.grantRead(4, 2), "every read answered and every slot free")
	require.Zero(t, s.grantRead(4, 2), "three free: less than a batch beside an outstanding read")
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
