package protopeek_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/razorbill/flo/libs/protopeek"
)

// message encodes fields 1 (varint), 2 (bytes) and 3 (fixed32), in that
// order, each as given when not nil.
func message(f1 *uint64, f2 []byte, f3 *uint32) []byte {
	var b []byte
	if f1 != nil {
		b = protowire.AppendVarint(protowire.AppendTag(b, 1, protowire.VarintType), *f1)
	}
	if f2 != nil {
		b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), f2)
	}
	if f3 != nil {
		b = protowire.AppendFixed32(protowire.AppendTag(b, 3, protowire.Fixed32Type), *f3)
	}
	return b
}

func TestPeekReadsOneFieldAndRefusesWhatIsNotAMessage(t *testing.T) {
	t.Parallel()
	seven, nine, fixed := uint64(7), uint64(9), uint32(5)
	full := message(&seven, []byte("origin"), &fixed)
	// A repeated field decodes to its last value.
	repeated := append(message(&seven, []byte("first"), nil), message(&nine, []byte("last"), nil)...)

	tests := []struct {
		name   string
		b      []byte
		bytes  []byte
		varint uint64
		ok     bool
	}{
		{name: "both fields", b: full, bytes: []byte("origin"), varint: 7, ok: true},
		{name: "the last of repeated fields", b: repeated, bytes: []byte("last"), varint: 9, ok: true},
		{name: "neither field", b: message(nil, nil, &fixed), ok: true},
		{name: "empty", b: nil, ok: true},
		{name: "cut short", b: full[:len(full)-2]},
		{name: "not a message", b: []byte("not protobuf \xff")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v, ok := protopeek.Bytes(tt.b, 2)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, string(tt.bytes), string(v))
			n, ok := protopeek.Varint(tt.b, 1)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.varint, n)
		})
	}

	// A field of another wire type than asked for is for a full decode to judge.
	_, ok := protopeek.Bytes(full, 1)
	require.False(t, ok)
	_, ok = protopeek.Varint(full, 3)
	require.False(t, ok)
}
