package codec

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

var (
	// errReflect says that the generated decoder would read the input
	// otherwise than proto.Unmarshal, or refuse what it accepts, so the input
	// is left to proto.Unmarshal. Flo's SDKs never send such input: a known
	// field with another wire type than its own, which proto.Unmarshal keeps
	// as an unknown field; an unknown field whose tag is not in its shortest
	// form, or in a well-known type, whose vtprotobuf decoder drops unknown
	// fields; a map entry with no message value, or more than one; a message
	// of a file that is not proto3, whose rules the check does not follow.
	errReflect = errors.New("input left to the reflection-based decoder")

	errNotUTF8     = errors.New("string field contains invalid UTF-8")
	errFieldNumber = errors.New("invalid field number")
	errEndGroup    = errors.New("end-group marker outside a group")
	errDepth       = errors.New("exceeded maximum recursion depth")
)

// check reports whether proto.Unmarshal would accept b as a message of type
// md, without building it: the same wire format rules, the same nesting
// limit and UTF-8 in every string field, as proto.Unmarshal requires of a
// proto3 file (google.golang.org/protobuf/internal/strs.EnforceUTF8). It
// returns errReflect for input the generated decoder would read otherwise.
func check(b []byte, md protoreflect.MessageDescriptor) error {
	return checkMessage(b, md, protowire.DefaultRecursionLimit)
}

// checkMessage checks a message with depth levels of nesting left, which it
// takes one of, as proto.Unmarshal does.
func checkMessage(b []byte, md protoreflect.MessageDescriptor, depth int) error {
	if depth--; depth < 0 {
		return errDepth
	}
	if md.Syntax() != protoreflect.Proto3 {
		return errReflect
	}
	fields := md.Fields()
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return err
		}
		if typ == protowire.EndGroupType {
			return errEndGroup
		}
		tagLen := n
		b = b[n:]
		fd := field(fields, num)
		if fd == nil {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return protowire.ParseError(n)
			}
			// proto.Unmarshal keeps an unknown field with its tag encoded
			// anew, the generated decoder as it came, and vtprotobuf's
			// decoders of the well-known types drop it.
			if tagLen != protowire.SizeTag(num) || md.ParentFile().Package() == "google.protobuf" {
				return errReflect
			}
			b = b[n:]
			continue
		}
		n, err = checkField(b, fd, typ, depth)
		if err == errNotUTF8 {
			return fmt.Errorf("%s: %w", fd.FullName(), err)
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// consumeTag reads the tag at the start of b, refusing a field number past
// the largest valid one, as proto.Unmarshal does.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int, error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, 0, protowire.ParseError(n)
	}
	if num > protowire.MaxValidNumber {
		return 0, 0, 0, errFieldNumber
	}
	return num, typ, n, nil
}

// checkField checks the value of fd at the start of b, sent with wire type
// typ, and returns its length.
func checkField(b []byte, fd protoreflect.FieldDescriptor, typ protowire.Type, depth int) (int, error) {
	kind := fd.Kind()
	if want := wireTypes[kind]; typ != want {
		// Packed: proto.Unmarshal takes either encoding of a repeated
		// scalar, whatever the field declares.
		if typ == protowire.BytesType && want != protowire.StartGroupType && fd.IsList() {
			return checkPacked(b, fd.Number(), want)
		}
		return 0, errReflect
	}
	switch kind {
	case protoreflect.MessageKind:
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		if fd.IsMap() {
			// proto.Unmarshal takes a level for a map entry too.
			if depth--; depth < 0 {
				return 0, errDepth
			}
			return n, checkMapEntry(v, fd, depth)
		}
		return n, checkMessage(v, fd.Message(), depth)
	case protoreflect.StringKind:
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		if !utf8.Valid(v) {
			return 0, errNotUTF8
		}
		return n, nil
	}
	n := protowire.ConsumeFieldValue(fd.Number(), typ, b)
	if n < 0 {
		return 0, protowire.ParseError(n)
	}
	return n, nil
}

// checkPacked checks the packed values of type typ of field num at the start
// of b and returns their length.
func checkPacked(b []byte, num protowire.Number, typ protowire.Type) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, protowire.ParseError(n)
	}
	for len(v) > 0 {
		m := protowire.ConsumeFieldValue(num, typ, v)
		if m < 0 {
			return 0, protowire.ParseError(m)
		}
		v = v[m:]
	}
	return n, nil
}

// checkMapEntry checks an entry of the map field fd: key 1, value 2, other
// fields skipped, each of them possibly repeated, as proto.Unmarshal reads it.
func checkMapEntry(b []byte, fd protoreflect.FieldDescriptor, depth int) error {
	fields := fd.Message().Fields()
	key, val := field(fields, 1), field(fields, 2)
	values := 0
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return err
		}
		b = b[n:]
		switch num {
		case 1:
			n, err = checkField(b, key, typ, depth)
			if err == errNotUTF8 {
				return fmt.Errorf("%s key: %w", fd.FullName(), err)
			}
		case 2:
			values++
			n, err = checkField(b, val, typ, depth)
			if err == errNotUTF8 {
				return fmt.Errorf("%s value: %w", fd.FullName(), err)
			}
		default:
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				err = protowire.ParseError(n)
			}
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	// The generated decoder replaces a message value where proto.Unmarshal
	// merges into it, and leaves a missing one nil where proto.Unmarshal
	// stores an empty message.
	if val.Kind() == protoreflect.MessageKind && values != 1 {
		return errReflect
	}
	return nil
}

// field is field num of fields, or nil. Fields are most often numbered from
// 1 in order, which spares the map lookup of ByNumber.
func field(fields protoreflect.FieldDescriptors, num protowire.Number) protoreflect.FieldDescriptor {
	if i := int(num) - 1; i < fields.Len() {
		if fd := fields.Get(i); fd.Number() == num {
			return fd
		}
	}
	return fields.ByNumber(num)
}

// wireTypes are the wire types of a single value of each kind.
var wireTypes = [...]protowire.Type{
	protoreflect.BoolKind:     protowire.VarintType,
	protoreflect.EnumKind:     protowire.VarintType,
	protoreflect.Int32Kind:    protowire.VarintType,
	protoreflect.Sint32Kind:   protowire.VarintType,
	protoreflect.Uint32Kind:   protowire.VarintType,
	protoreflect.Int64Kind:    protowire.VarintType,
	protoreflect.Sint64Kind:   protowire.VarintType,
	protoreflect.Uint64Kind:   protowire.VarintType,
	protoreflect.Sfixed32Kind: protowire.Fixed32Type,
	protoreflect.Fixed32Kind:  protowire.Fixed32Type,
	protoreflect.FloatKind:    protowire.Fixed32Type,
	protoreflect.Sfixed64Kind: protowire.Fixed64Type,
	protoreflect.Fixed64Kind:  protowire.Fixed64Type,
	protoreflect.DoubleKind:   protowire.Fixed64Type,
	protoreflect.StringKind:   protowire.BytesType,
	protoreflect.BytesKind:    protowire.BytesType,
	protoreflect.MessageKind:  protowire.BytesType,
	protoreflect.GroupKind:    protowire.StartGroupType,
}
