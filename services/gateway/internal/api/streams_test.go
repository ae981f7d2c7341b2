package api

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMaxReadRecords(t *testing.T) {
	require.Equal(t, 255, MaxReadRecords(1<<20), "records at the default 1 MiB limit")
	require.Equal(t, MaxReadCount, MaxReadRecords(16), "small records: the protocol's cap")
	require.Equal(t, 1, MaxReadRecords(1<<30), "at least one record")
}

func TestReadCount(t *testing.T) {
	tests := []struct {
		name       string
		count, def int32
		limit      int
		want       int32
	}{
		{name: "zero keeps the service default", count: 0, def: 100, limit: 255, want: 0},
		{name: "zero above the limit asks for the limit", count: 0, def: 100, limit: 50, want: 50},
		{name: "within the limit", count: 40, def: 10, limit: 255, want: 40},
		{name: "capped", count: 1000, def: 10, limit: 255, want: 255},
		{name: "negative goes through for the service to refuse", count: -1, def: 10, limit: 255, want: -1},
		{name: "over the protocol cap is capped", count: MaxReadCount + 1, def: 10, limit: MaxReadCount, want: MaxReadCount},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, ReadCount(tc.count, tc.def, tc.limit))
		})
	}
}
