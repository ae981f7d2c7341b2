// Package codec holds Flo's gRPC codecs. They encode and decode with the
// methods protoc-gen-go-vtproto generates (proto/buf.gen.yaml), which need
// no reflection, instead of google.golang.org/protobuf's, which gRPC's
// default codec uses; messages without them fall back to the latter.
//
// The generated decoder does not check that string fields hold valid UTF-8,
// as the reflection-based one does. So Fast, the codec of the calls between
// Flo's own parts (the services' internal ports, the SDK's connection to the
// gateway), decodes only what Flo itself encoded from input already checked;
// a record any producer may write (an invoke command) is decoded this way
// only where each string kept is checked (libs/text) after decoding. A
// server that takes calls from outside (the gateway's public port) decodes
// with Public, which checks every string on the wire before the generated
// decoder runs: the reflection-based decoder, which gRPC's default codec
// would use, cost a few per cent of the gateway's CPU and allocations.
package codec

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Public is the codec of a server that takes calls from outside (the
// gateway's public port). It accepts exactly what gRPC's default codec
// (proto.Unmarshal) accepts, refusing strings that are not UTF-8, without
// that codec's reflection: a walk of the wire bytes, guided by the message's
// descriptor, checks them as proto.Unmarshal would, every string field
// included, and the generated decoder then decodes them. Input that the
// generated decoder would read otherwise than proto.Unmarshal, which Flo's
// SDKs never send (a field with another wire type than its own, for one), is
// decoded with proto.Unmarshal. Public encodes as Fast does, since what such
// a server sends was built by Flo from input checked on the way in.
var Public encoding.CodecV2 = public{}

type public struct{}

// Name is the content subtype on the wire, the same as gRPC's default codec.
func (public) Name() string { return "proto" }

// Marshal encodes v as Fast does.
func (public) Marshal(v any) (mem.BufferSlice, error) { return fast{}.Marshal(v) }

// Unmarshal decodes data into v, or fails, as proto.Unmarshal would. Both
// decoders copy strings and bytes out of data, so the buffer goes back to the
// pool at once.
func (public) Unmarshal(data mem.BufferSlice, v any) error {
	pm, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal: %T is not a protobuf message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if m, ok := v.(vtMessage); ok {
		err := check(b, pm.ProtoReflect().Descriptor())
		if err == nil {
			// proto.Unmarshal replaces what v held, UnmarshalVT merges into it.
			proto.Reset(pm)
			if err := m.UnmarshalVT(b); err != nil {
				return fmt.Errorf("unmarshal %T: %w", v, err)
			}
			return nil
		}
		if err != errReflect {
			return fmt.Errorf("unmarshal %T: %w", v, err)
		}
	}
	if err := proto.Unmarshal(b, pm); err != nil {
		return fmt.Errorf("unmarshal %T: %w", v, err)
	}
	return nil
}

// vtMessage is a message with generated marshal, unmarshal and size methods.
type vtMessage interface {
	SizeVT() int
	MarshalToSizedBufferVT(dAtA []byte) (int, error)
	UnmarshalVT(dAtA []byte) error
}

// Fast is the codec: pass it with grpc.ForceCodecV2 (clients) or
// grpc.ForceServerCodecV2 (servers). It keeps gRPC's codec name, "proto",
// so either side may use gRPC's default codec instead.
var Fast encoding.CodecV2 = fast{}

type fast struct{}

// Name is the content subtype on the wire, the same as gRPC's default codec.
func (fast) Name() string { return "proto" }

// Marshal encodes v into one buffer, taken from gRPC's pool when it is large
// enough to be worth pooling, as gRPC's default codec does.
func (fast) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMessage)
	if !ok {
		return fallbackMarshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if _, err := m.MarshalToSizedBufferVT(buf); err != nil {
			return nil, fmt.Errorf("marshal %T: %w", v, err)
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVT((*buf)[:size]); err != nil {
		pool.Put(buf)
		return nil, fmt.Errorf("marshal %T: %w", v, err)
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes data into v. The generated decoder copies strings and
// bytes out of data, so the buffer goes back to the pool at once.
func (fast) Unmarshal(data mem.BufferSlice, v any) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	m, ok := v.(vtMessage)
	if !ok {
		pm, ok := v.(proto.Message)
		if !ok {
			return fmt.Errorf("unmarshal: %T is not a protobuf message", v)
		}
		return proto.Unmarshal(buf.ReadOnlyData(), pm)
	}
	if err := m.UnmarshalVT(buf.ReadOnlyData()); err != nil {
		return fmt.Errorf("unmarshal %T: %w", v, err)
	}
	return nil
}

func fallbackMarshal(v any) (mem.BufferSlice, error) {
	pm, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal: %T is not a protobuf message", v)
	}
	b, err := proto.Marshal(pm)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}
