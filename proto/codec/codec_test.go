package codec_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/proto/codec"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
)

func event(result []byte) *eventsv1.TaskEvent {
	return &eventsv1.TaskEvent{
		EventId: "e-1", Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED,
		TaskId: "t-1", Namespace: "default", Action: "resize", Attempt: 2,
		Outcome: "ok", OccurredAt: timestamppb.New(time.Unix(1700000000, 5)),
		Result: result, State: []byte{1, 2, 3},
	}
}

// Fast and the reflection-based encoding read each other's bytes, small
// messages and ones large enough for gRPC's buffer pool alike.
func TestFastMatchesTheReflectionEncoding(t *testing.T) {
	for name, result := range map[string][]byte{
		"small":  []byte(`{"n":1}`),
		"pooled": bytes.Repeat([]byte("x"), 64<<10),
	} {
		t.Run(name, func(t *testing.T) {
			in := event(result)
			data, err := codec.Fast.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			wire := data.Materialize()
			data.Free()
			want, err := proto.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			var viaProto eventsv1.TaskEvent
			if err := proto.Unmarshal(wire, &viaProto); err != nil {
				t.Fatalf("reflection decoder on Fast's bytes: %v", err)
			}
			if !proto.Equal(&viaProto, in) {
				t.Fatalf("decoded %v, want %v", &viaProto, in)
			}
			var viaFast eventsv1.TaskEvent
			if err := codec.Fast.Unmarshal(mem.BufferSlice{mem.SliceBuffer(want)}, &viaFast); err != nil {
				t.Fatalf("Fast on the reflection encoder's bytes: %v", err)
			}
			if !proto.Equal(&viaFast, in) {
				t.Fatalf("decoded %v, want %v", &viaFast, in)
			}
		})
	}
}

// A decoded message owns its bytes: the buffer it came from goes back to the
// pool and is reused.
func TestFastDecodedMessageOutlivesItsBuffer(t *testing.T) {
	in := event(bytes.Repeat([]byte("r"), 64<<10))
	wire, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	buf := append([]byte(nil), wire...)
	var out eventsv1.TaskEvent
	if err := codec.Fast.Unmarshal(mem.BufferSlice{mem.SliceBuffer(buf)}, &out); err != nil {
		t.Fatal(err)
	}
	clear(buf)
	if !proto.Equal(&out, in) {
		t.Fatal("the decoded message changed with the buffer it was decoded from")
	}
}

// Messages without generated methods go through the reflection encoding;
// anything else is refused with an error, not a panic.
func TestFastFallsBackAndRefuses(t *testing.T) {
	ts := timestamppb.New(time.Unix(42, 7))
	data, err := codec.Fast.Marshal(ts)
	if err != nil {
		t.Fatal(err)
	}
	var out timestamppb.Timestamp
	if err := codec.Fast.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&out, ts) {
		t.Fatalf("decoded %v, want %v", &out, ts)
	}
	if _, err := codec.Fast.Marshal("not a message"); err == nil || !strings.Contains(err.Error(), "not a protobuf message") {
		t.Fatalf("Marshal of a string: %v", err)
	}
	if err := codec.Fast.Unmarshal(data, new(int)); err == nil {
		t.Fatal("Unmarshal into an int succeeded")
	}
	var bad eventsv1.TaskEvent
	if err := codec.Fast.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0xff})}, &bad); err == nil {
		t.Fatal("a truncated message decoded without error")
	}
}

// Public encodes as Fast does, and decodes as gRPC's default codec does:
// a string that is not UTF-8, which Fast would take, is refused.
func TestPublicChecksWhatItDecodes(t *testing.T) {
	in := event([]byte(`{"n":1}`))
	data, err := codec.Public.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out eventsv1.TaskEvent
	if err := codec.Public.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&out, in) {
		t.Fatalf("decoded %v, want %v", &out, in)
	}
	// Field 3 (task_id), a string of one byte that is not UTF-8.
	notUTF8 := []byte{0x1a, 0x01, 0xff}
	if err := codec.Fast.Unmarshal(mem.BufferSlice{mem.SliceBuffer(notUTF8)}, &out); err != nil {
		t.Fatalf("Fast refused it (%v): the test no longer shows the difference", err)
	}
	if err := codec.Public.Unmarshal(mem.BufferSlice{mem.SliceBuffer(notUTF8)}, &out); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("Public decoded a string that is not UTF-8: %v", err)
	}
}
