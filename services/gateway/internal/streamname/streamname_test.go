package streamname

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{name: "plain", in: "events", ok: true},
		{name: "dead-letter stream", in: "events.dlq", ok: true},
		{name: "all allowed characters", in: "A_z-9.x", ok: true},
		{name: "underscore first", in: "_x", ok: true},
		{name: "longest", in: strings.Repeat("a", MaxLen), ok: true},
		{name: "empty", in: ""},
		{name: "too long", in: strings.Repeat("a", MaxLen+1)},
		{name: "dot first", in: ".x"},
		{name: "dash first", in: "-x"},
		{name: "slash", in: "a/b"},
		{name: "space", in: "a b"},
		{name: "colon", in: "a:b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Check("stream", tc.in)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Contains(t, err.Error(), "stream")
		})
	}
}

func TestCheckID(t *testing.T) {
	for _, ok := range []string{"0-0", "1700000000000-5001", "18446744073709551615-1"} {
		require.NoError(t, CheckID(ok), ok)
	}
	for _, bad := range []string{"", "-", "1-", "-1", "1", "1-2-3", "a-1", "1-b", "+1-2", "1--2", " 1-2", "18446744073709551616-1"} {
		err := CheckID(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "want <ms>-<seq>")
	}
}
