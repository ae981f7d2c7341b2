// Package protopeek reads one field of an encoded protobuf message without
// decoding the rest, for consumers that skip most of the records they read
// by one field (a task event's type or origin) and decode only the others.
package protopeek

import "google.golang.org/protobuf/encoding/protowire"

// Bytes returns the value of the length-delimited field num of message b,
// the last one when it repeats (as a decode keeps), or nil when b has none.
// ok is false when b is not a well-formed message or field num has another
// wire type: then only a full decode can say what is wrong.
func Bytes(b []byte, num protowire.Number) (v []byte, ok bool) {
	ok = scan(b, num, protowire.BytesType, func(field []byte) int {
		var n int
		v, n = protowire.ConsumeBytes(field)
		return n
	})
	if !ok {
		return nil, false
	}
	return v, true
}

// Varint returns the value of the varint field num of message b (an enum,
// an integer, a bool), the last one when it repeats, or 0 when b has none;
// ok is as for Bytes.
func Varint(b []byte, num protowire.Number) (v uint64, ok bool) {
	ok = scan(b, num, protowire.VarintType, func(field []byte) int {
		var n int
		v, n = protowire.ConsumeVarint(field)
		return n
	})
	if !ok {
		return 0, false
	}
	return v, true
}

// scan walks the fields of b, handing the value of each field num of wire
// type typ to take, which returns its length or a negative number when it
// is cut short.
func scan(b []byte, num protowire.Number, typ protowire.Type, take func([]byte) int) bool {
	for len(b) > 0 {
		fnum, ftyp, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case fnum == num && ftyp != typ:
			return false
		case fnum == num:
			n = take(b)
		default:
			n = protowire.ConsumeFieldValue(fnum, ftyp, b)
		}
		if n < 0 {
			return false
		}
		b = b[n:]
	}
	return true
}
