package codec_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/proto/codec"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// fuzzTypes are the messages the fuzz test decodes, by index: those of the
// public API, every one the gateway's public port may be sent, by name, then
// one with a repeated scalar, which they lack. New messages shift the index
// of those after them, which only makes some seeds in testdata seed other
// messages.
var fuzzTypes = func() []protoreflect.MessageType {
	var types []protoreflect.MessageType
	for _, fd := range []protoreflect.FileDescriptor{flov1.File_flo_v1_api_proto, flov1.File_flo_v1_keys_proto} {
		msgs := fd.Messages()
		for i := range msgs.Len() {
			mt, err := protoregistry.GlobalTypes.FindMessageByName(msgs.Get(i).FullName())
			if err != nil {
				panic(err)
			}
			types = append(types, mt)
		}
	}
	slices.SortFunc(types, func(a, b protoreflect.MessageType) int {
		return strings.Compare(string(a.Descriptor().FullName()), string(b.Descriptor().FullName()))
	})
	return append(types, (&dispatcherv1.Replica{}).ProtoReflect().Type())
}()

// typeIndex is the index in fuzzTypes of m's type.
func typeIndex(t testing.TB, m proto.Message) uint16 {
	name := m.ProtoReflect().Descriptor().FullName()
	i := slices.IndexFunc(fuzzTypes, func(mt protoreflect.MessageType) bool { return mt.Descriptor().FullName() == name })
	if i < 0 {
		t.Fatalf("the fuzz test does not decode %s", name)
	}
	return uint16(i)
}

// encode encodes m without checking its strings, as a sender outside might.
func encode(t testing.TB, m proto.Message) []byte {
	data, err := codec.Fast.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	return data.Materialize()
}

func publicUnmarshal(data []byte, m proto.Message) error {
	return codec.Public.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, m)
}

// requireAsProtoUnmarshal decodes data as a message of type mt with Public
// and with proto.Unmarshal, and fails unless both fail or both decode the
// same message. It returns Public's error.
func requireAsProtoUnmarshal(t testing.TB, mt protoreflect.MessageType, data []byte) error {
	t.Helper()
	want := mt.New().Interface()
	wantErr := proto.Unmarshal(data, want)
	got := mt.New().Interface()
	err := publicUnmarshal(data, got)
	switch {
	case (err == nil) != (wantErr == nil):
		t.Fatalf("%s from %x: Public: %v; proto.Unmarshal: %v", mt.Descriptor().FullName(), data, err, wantErr)
	case err == nil && !proto.Equal(got, want):
		// Encoded, since the text format hides how unknown fields differ.
		t.Fatalf("%s from %x: Public decoded\n%v(%x)\nproto.Unmarshal\n%v(%x)", mt.Descriptor().FullName(), data,
			prototext.Format(got), deterministic(t, got), prototext.Format(want), deterministic(t, want))
	}
	return err
}

func deterministic(t testing.TB, m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// workerResult is a typical message on a worker's stream.
func workerResult(body []byte, traceContext map[string]string) *flov1.WorkerMessage {
	return &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: &flov1.Result{
		TaskId:       "0190f1c2-7a4b-7c3d-9e8f-0123456789ab",
		Attempt:      1,
		Outcome:      &flov1.Result_Completed{Completed: &flov1.Completed{Body: body, Outcome: "ok"}},
		TraceContext: traceContext,
	}}}
}

// validMessages are messages of the public API, with every kind of field
// the check walks: nested, repeated, map, oneof, well-known types.
func validMessages() []proto.Message {
	input, err := structpb.NewValue(map[string]any{"n": 1.5, "tags": []any{"a", true, nil}, "nested": map[string]any{"é": "ü"}})
	if err != nil {
		panic(err)
	}
	return []proto.Message{
		workerResult([]byte(`{"n":1}`), map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":  "rojo=00f067aa0ba902b7",
		}),
		&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{
			Token: "flo_k1_secret", WorkerId: "w-1", Namespace: "default", MachineId: "m-1",
			Actions: []string{"resize", "thumbnail"}, MaxConcurrency: 8,
			Streams: []*flov1.StreamSubscription{{Stream: "orders", Group: "billing", Consumer: "w-1"}},
		}}},
		&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_ResultBatch{ResultBatch: &flov1.ResultBatch{Results: []*flov1.Result{
			{TaskId: "t-1", Attempt: 2, Outcome: &flov1.Result_Failed{Failed: &flov1.Failed{Error: "boom", Retry: true, ErrorCode: "rate_limited"}}},
			{TaskId: "t-2", Outcome: &flov1.Result_Pending{Pending: &flov1.Pending{TimeoutMs: 60000}}},
		}}}},
		&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Heartbeat{Heartbeat: &flov1.Heartbeat{CurrentLoad: 3, CpuLoad: 0.5, MemoryLoad: 0.25}}},
		&flov1.InvokeTasksRequest{Namespace: "default", Tasks: []*flov1.InvokeTaskRequest{
			{Action: "resize", Payload: []byte(`{"w":100}`), IdempotencyKey: "k-1", Priority: 2, DelayMs: -1,
				TraceContext: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
			{Action: "thumbnail", Input: input},
		}},
		&flov1.AppendRequest{Namespace: "default", Stream: "orders", Records: []*flov1.AppendRecord{
			{Payload: []byte("raw"), Headers: map[string]string{"content-type": "application/json", "": ""}, Key: "c-42"},
			{Value: input},
		}},
		&flov1.ListRunsRequest{Namespace: "default", Workflow: "order", Status: flov1.RunStatus_RUN_STATUS_RUNNING,
			CreatedAfter: timestamppb.New(time.Unix(1700000000, 5)), Limit: 10, Where: `customer_id = "c-42"`},
	}
}

// Public refuses a string that is not UTF-8 wherever it is, and names the
// field; the generated decoder alone would take it.
func TestPublicRefusesStringsThatAreNotUTF8(t *testing.T) {
	const bad = "ok\xff"
	value := func(v *structpb.Value) *flov1.InvokeTasksRequest {
		return &flov1.InvokeTasksRequest{Tasks: []*flov1.InvokeTaskRequest{{Action: "resize", Input: v}}}
	}
	tests := []struct {
		name  string
		msg   proto.Message
		field string
	}{
		{name: "top-level string", msg: &flov1.InvokeTasksRequest{Namespace: bad}, field: "flo.v1.InvokeTasksRequest.namespace"},
		{name: "string in a nested message", msg: &flov1.InvokeTasksRequest{Tasks: []*flov1.InvokeTaskRequest{{Action: "a"}, {Action: bad}}}, field: "flo.v1.InvokeTaskRequest.action"},
		{name: "repeated string", msg: &flov1.AckRequest{Ids: []string{"1-0", bad}}, field: "flo.v1.AckRequest.ids"},
		{name: "map key", msg: workerResult(nil, map[string]string{bad: "v"}), field: "flo.v1.Result.trace_context key"},
		{name: "map value", msg: workerResult(nil, map[string]string{"traceparent": bad}), field: "flo.v1.Result.trace_context value"},
		{name: "string in a oneof message", msg: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Nack{Nack: &flov1.Nack{TaskId: "t-1", Reason: bad}}}, field: "flo.v1.Nack.reason"},
		{name: "repeated string in a oneof message", msg: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{Actions: []string{bad}}}}, field: "flo.v1.Hello.actions"},
		{name: "oneof in a oneof message", msg: &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: &flov1.Result{
			Outcome: &flov1.Result_Failed{Failed: &flov1.Failed{Error: bad}}}}}, field: "flo.v1.Failed.error"},
		{name: "string member of a oneof", msg: value(structpb.NewStringValue(bad)), field: "google.protobuf.Value.string_value"},
		{name: "key of a struct", msg: value(structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{bad: structpb.NewNullValue()}})), field: "google.protobuf.Struct.fields key"},
		{name: "string in a list", msg: value(structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue(bad)}})), field: "google.protobuf.Value.string_value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			data := encode(t, tt.msg)
			mt := tt.msg.ProtoReflect().Type()
			if err := codec.Fast.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, mt.New().Interface()); err != nil {
				t.Fatalf("Fast refused it (%v): the test no longer shows the difference", err)
			}
			err := requireAsProtoUnmarshal(t, mt, data)
			if err == nil || !strings.Contains(err.Error(), tt.field+": string field contains invalid UTF-8") {
				t.Fatalf("Public on a string that is not UTF-8 in %s: %v", tt.field, err)
			}
		})
	}
}

// The same bytes in a bytes field are taken, and a valid message decodes as
// proto.Unmarshal decodes it.
func TestPublicDecodesAsProtoUnmarshal(t *testing.T) {
	msgs := append(validMessages(),
		workerResult([]byte("ok\xff"), nil),
		&flov1.InvokeTasksRequest{Tasks: []*flov1.InvokeTaskRequest{{Action: "resize", Payload: []byte{0xff, 0xfe}}}},
	)
	for _, m := range msgs {
		t.Run(string(m.ProtoReflect().Descriptor().Name()), func(t *testing.T) {
			t.Parallel()
			data := encode(t, m)
			if err := requireAsProtoUnmarshal(t, m.ProtoReflect().Type(), data); err != nil {
				t.Fatal(err)
			}
			got := m.ProtoReflect().Type().New().Interface()
			if err := publicUnmarshal(data, got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, m) {
				t.Fatalf("decoded %v, want %v", got, m)
			}
		})
	}
}

type taskServer struct {
	flov1.UnimplementedTaskServiceServer
}

func (taskServer) InvokeTasks(_ context.Context, req *flov1.InvokeTasksRequest) (*flov1.InvokeTasksResponse, error) {
	return &flov1.InvokeTasksResponse{TaskIds: []string{req.GetNamespace()}}, nil
}

// A server decoding with Public answers a call with a string that is not
// UTF-8 with Internal, as one decoding with gRPC's default codec does.
func TestPublicServerRefusesWithInternal(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(codec.Public))
	flov1.RegisterTaskServiceServer(srv, taskServer{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	// Fast encodes strings that are not UTF-8 as they are.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec.Fast)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := flov1.NewTaskServiceClient(conn)

	resp, err := client.InvokeTasks(t.Context(), &flov1.InvokeTasksRequest{Namespace: "default"})
	if err != nil || !slices.Equal(resp.GetTaskIds(), []string{"default"}) {
		t.Fatalf("InvokeTasks: %v, %v", resp, err)
	}
	_, err = client.InvokeTasks(t.Context(), &flov1.InvokeTasksRequest{Namespace: "ok\xff"})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "flo.v1.InvokeTasksRequest.namespace: string field contains invalid UTF-8") {
		t.Fatalf("InvokeTasks with a namespace that is not UTF-8: %v", err)
	}
}

// Public replaces what the message held, as proto.Unmarshal does.
func TestPublicReplacesTheMessage(t *testing.T) {
	m := &flov1.InvokeTasksRequest{Namespace: "old", Tasks: []*flov1.InvokeTaskRequest{{Action: "old"}}}
	if err := publicUnmarshal(encode(t, &flov1.InvokeTasksRequest{Namespace: "new"}), m); err != nil {
		t.Fatal(err)
	}
	if want := (&flov1.InvokeTasksRequest{Namespace: "new"}); !proto.Equal(m, want) {
		t.Fatalf("decoded %v, want %v", m, want)
	}
}

// Input the generated decoder would read otherwise than proto.Unmarshal, or
// refuse where proto.Unmarshal accepts it, and malformed input, all of
// which Flo's SDKs never send: Public takes or refuses each as
// proto.Unmarshal does.
func TestPublicOnOddInput(t *testing.T) {
	tag := func(num protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(nil, num, typ) }
	field := func(num protowire.Number, value ...[]byte) []byte {
		return protowire.AppendBytes(tag(num, protowire.BytesType), bytes.Join(value, nil))
	}
	str := func(num protowire.Number, s string) []byte { return field(num, []byte(s)) }
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(tag(num, protowire.VarintType), v)
	}
	result := func(fields ...[]byte) []byte { return field(3, fields...) } // WorkerMessage.result
	// ListRunsRequest.created_after, a Timestamp.
	timestamp := func(fields ...[]byte) []byte { return field(4, fields...) }
	// InvokeTasksRequest.tasks[0].input, a Value holding a Struct.
	structEntry := func(fields ...[]byte) []byte { return field(2, field(4, field(5, field(1, fields...)))) }
	tests := []struct {
		name string
		msg  proto.Message
		data []byte
	}{
		{name: "string field as a varint", msg: &flov1.InvokeTasksRequest{}, data: varint(1, 7)},
		{name: "message field as a fixed64", msg: &flov1.WorkerMessage{}, data: protowire.AppendFixed64(tag(3, protowire.Fixed64Type), 7)},
		{name: "int field as bytes", msg: &flov1.WorkerMessage{}, data: result(str(2, "ab"))},
		{name: "string field as a group", msg: &flov1.InvokeTasksRequest{}, data: slices.Concat(tag(1, protowire.StartGroupType), varint(2, 1), tag(1, protowire.EndGroupType))},
		{name: "string field as an unterminated group", msg: &flov1.InvokeTasksRequest{}, data: slices.Concat(tag(1, protowire.StartGroupType), varint(2, 1))},
		{name: "unknown field", msg: &flov1.WorkerMessage{}, data: slices.Concat(varint(99, 1), result(str(77, "x\xff")))},
		{name: "unknown group", msg: &flov1.WorkerMessage{}, data: slices.Concat(tag(99, protowire.StartGroupType), varint(2, 1), tag(99, protowire.EndGroupType))},
		{name: "unknown group ended by another", msg: &flov1.WorkerMessage{}, data: slices.Concat(tag(99, protowire.StartGroupType), tag(98, protowire.EndGroupType))},
		{name: "unknown field with a padded tag", msg: &flov1.WorkerMessage{}, data: []byte{0xf8, 0x86, 0x00, 0x01}},
		{name: "known field with a padded tag", msg: &flov1.InvokeTasksRequest{}, data: []byte{0x8a, 0x00, 0x01, 'x'}},
		{name: "padded length", msg: &flov1.InvokeTasksRequest{}, data: []byte{0x0a, 0x81, 0x80, 0x00, 'x'}},
		{name: "unknown field in a Timestamp", msg: &flov1.ListRunsRequest{}, data: timestamp(varint(1, 5), varint(3, 1))},
		{name: "end group at the top", msg: &flov1.WorkerMessage{}, data: tag(5, protowire.EndGroupType)},
		{name: "reserved wire type", msg: &flov1.WorkerMessage{}, data: []byte{0x0e}},
		{name: "field number zero", msg: &flov1.WorkerMessage{}, data: []byte{0x02, 0x00}},
		{name: "field number above the largest", msg: &flov1.WorkerMessage{}, data: varint(protowire.MaxValidNumber+1, 1)},
		{name: "varint of eleven bytes", msg: &flov1.WorkerMessage{}, data: result(tag(2, protowire.VarintType), bytes.Repeat([]byte{0x80}, 10), []byte{0x01})},
		{name: "varint whose tenth byte overflows", msg: &flov1.WorkerMessage{}, data: result(tag(2, protowire.VarintType), bytes.Repeat([]byte{0x80}, 9), []byte{0x02})},
		{name: "truncated", msg: &flov1.WorkerMessage{}, data: result(str(1, "abc"))[:5]},
		{name: "map entry with a key as a varint", msg: &flov1.WorkerMessage{}, data: result(field(5, varint(1, 3), str(2, "v")))},
		{name: "map entry with an unknown field", msg: &flov1.WorkerMessage{}, data: result(field(5, str(1, "k"), varint(3, 1), str(2, "v")))},
		{name: "map entry without a key or value", msg: &flov1.WorkerMessage{}, data: result(field(5))},
		{name: "map entry with a key beyond it", msg: &flov1.WorkerMessage{}, data: result(tag(5, protowire.BytesType), []byte{2}, tag(1, protowire.BytesType), []byte{2}, varint(2, 1))},
		{name: "map entry twice with one key", msg: &flov1.WorkerMessage{}, data: result(field(5, str(1, "k"), str(2, "a")), field(5, str(1, "k"), str(2, "b")))},
		{name: "struct entry without a value", msg: &flov1.InvokeTasksRequest{}, data: structEntry(str(1, "k"))},
		{name: "struct entry with two values", msg: &flov1.InvokeTasksRequest{}, data: structEntry(str(1, "k"), field(2, field(5, field(1, str(1, "a"), field(2, varint(4, 1))))), field(2, field(5, field(1, str(1, "b"), field(2, varint(4, 0))))))},
		{name: "oneof member twice", msg: &flov1.WorkerMessage{}, data: slices.Concat(result(str(1, "t-1")), field(5, str(1, "t-2")), result(varint(2, 3)))},
		{name: "message field twice", msg: &flov1.ListRunsRequest{}, data: slices.Concat(timestamp(varint(1, 5)), timestamp(varint(2, 7)))},
		// The public API has no repeated scalar; Replica.partitions is one.
		{name: "packed and unpacked", msg: &dispatcherv1.Replica{}, data: slices.Concat(field(2, []byte{1, 0xac, 0x02}), varint(2, 3), field(2))},
		{name: "packed as a varint too long", msg: &dispatcherv1.Replica{}, data: field(2, bytes.Repeat([]byte{0x80}, 9), []byte{0x02})},
		// The generated decoder reads the last value on into the next
		// field, which it then reads as fields: 3 = 0, 4 = "xxx…".
		{name: "packed and cut short", msg: &dispatcherv1.Replica{}, data: slices.Concat(field(2, []byte{1, 0x80}), field(5, []byte{0}, str(4, strings.Repeat("x", 21))))},
		{name: "packed as a string", msg: &dispatcherv1.Replica{}, data: field(1, []byte{1, 2})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			requireAsProtoUnmarshal(t, tt.msg.ProtoReflect().Type(), tt.data)
		})
	}
}

// proto2Message is a message of a proto2 file with the generated decoder's
// methods, which Public must not use for it.
type proto2Message struct {
	*descriptorpb.FieldDescriptorProto
}

func (proto2Message) SizeVT() int { return 0 }
func (proto2Message) MarshalToSizedBufferVT([]byte) (int, error) {
	return 0, errors.New("not for encoding")
}
func (proto2Message) UnmarshalVT([]byte) error { return errors.New("UnmarshalVT was called") }

// A message of a file that is not proto3, whose strings proto.Unmarshal does
// not check, is left to proto.Unmarshal.
func TestPublicLeavesProto2ToProtoUnmarshal(t *testing.T) {
	in := &descriptorpb.FieldDescriptorProto{Name: proto.String("ok\xff"), Number: proto.Int32(1)}
	data, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out := proto2Message{new(descriptorpb.FieldDescriptorProto)}
	if err := publicUnmarshal(data, out); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(out, in) {
		t.Fatalf("decoded %v, want %v", out, in)
	}
}

// Public has proto.Unmarshal's limit on nesting, counting map entries as
// proto.Unmarshal counts them.
func TestPublicNestingLimit(t *testing.T) {
	bytesField := func(num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	// A Value holding a list of one value: two levels.
	list := func(v []byte) []byte { return bytesField(6, bytesField(1, v)) }
	// A Value holding a struct of one field: three levels, with the entry.
	strukt := func(v []byte) []byte {
		return bytesField(5, bytesField(1, slices.Concat(bytesField(1, nil), bytesField(2, v))))
	}
	tests := []struct {
		name           string
		lists, structs int
	}{
		// InvokeTasksRequest, InvokeTaskRequest and its input Value are
		// three levels, then each list two and each struct three.
		{name: "lists below the limit", lists: 4998},
		{name: "lists beyond the limit", lists: 4999},
		{name: "a struct at the limit", lists: 4997, structs: 1},
		{name: "structs beyond the limit", lists: 4996, structs: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var value []byte
			for range tt.lists {
				value = list(value)
			}
			for range tt.structs {
				value = strukt(value)
			}
			levels := 3 + 2*tt.lists + 3*tt.structs
			err := requireAsProtoUnmarshal(t, (&flov1.InvokeTasksRequest{}).ProtoReflect().Type(), bytesField(2, bytesField(4, value)))
			if (err == nil) != (levels <= protowire.DefaultRecursionLimit) {
				t.Fatalf("%d levels of nesting: %v", levels, err)
			}
		})
	}
}

// Public decodes exactly as proto.Unmarshal does: the same input taken and
// refused, the same messages decoded.
func FuzzPublicMatchesProtoUnmarshal(f *testing.F) {
	for _, m := range validMessages() {
		data := encode(f, m)
		f.Add(typeIndex(f, m), data)
		// The same message with a string, found by its value, not UTF-8.
		for _, s := range []string{"w-1", "traceparent", "resize", "a", "é", "k-1"} {
			if i := bytes.Index(data, []byte(s)); i >= 0 {
				bad := slices.Clone(data)
				bad[i] = 0xff
				f.Add(typeIndex(f, m), bad)
			}
		}
	}
	replica := &dispatcherv1.Replica{Address: "10.0.0.1:7070", Partitions: []int32{0, 7, 300, -1}}
	f.Add(typeIndex(f, replica), encode(f, replica))
	f.Fuzz(func(t *testing.T, kind uint16, data []byte) {
		requireAsProtoUnmarshal(t, fuzzTypes[int(kind)%len(fuzzTypes)], data)
	})
}

// The decode of a typical message on a worker's stream by gRPC's default
// codec (reflection), as Public decoded before, and by Public; Fast, which
// does not check strings, is the floor.
func BenchmarkPublicUnmarshal(b *testing.B) {
	data := encode(b, workerResult([]byte(`{"id":42,"status":"resized","width":100,"height":80}`), map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "rojo=00f067aa0ba902b7",
	}))
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{
		{name: "reflection", codec: encoding.GetCodecV2(grpcproto.Name)},
		{name: "public", codec: codec.Public},
		{name: "fast-unchecked", codec: codec.Fast},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var m flov1.WorkerMessage
				if err := c.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
