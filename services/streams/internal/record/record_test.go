package record_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/streams/internal/record"
)

func TestIDRoundTrip(t *testing.T) {
	t.Parallel()
	id := record.NewID(1_700_000_000_123, 7, 42)
	require.Equal(t, "1700000000123-42007", id.String())
	require.Equal(t, int32(7), id.Partition())
	require.Equal(t, int64(42), id.Offset())
	parsed, err := record.ParseID(id.String())
	require.NoError(t, err)
	require.Equal(t, id, parsed)
}

func TestIDOrder(t *testing.T) {
	t.Parallel()
	a := record.NewID(100, 3, 5)
	require.Equal(t, -1, a.Compare(record.NewID(100, 0, 6)), "same ms: the sequence decides")
	require.Equal(t, 1, a.Compare(record.NewID(99, 0, 600)), "the time decides first")
	require.Zero(t, a.Compare(record.NewID(100, 3, 5)))
}

func TestParseIDRejectsMalformed(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "x", "1", "1-", "-1", "1-2-3", "a-1", "1-b", "+1-2", "1-+2", "-1-2", "99999999999999999999-1"} {
		_, err := record.ParseID(s)
		kind, msg, ok := fault.KindOf(err)
		require.True(t, ok, s)
		require.Equal(t, fault.Invalid, kind, s)
		require.Contains(t, msg, "want <ms>-<seq>", s)
	}
}

func TestPositions(t *testing.T) {
	t.Parallel()
	id := record.NewID(10, 0, 1)
	for _, tt := range []struct {
		in   string
		want record.Start
	}{
		{"", record.Start{Kind: record.FromFirst}},
		{"-", record.Start{Kind: record.FromFirst}},
		{"$", record.Start{Kind: record.FromNew}},
		{"10-1000", record.Start{Kind: record.FromID, ID: id}},
		{"(10-1000", record.Start{Kind: record.AfterID, ID: id}},
		{record.Cursor(7, []int64{21, 0, 3}), record.Start{Kind: record.AtCursor, Stream: 7, Offsets: []int64{21, 0, 3}}},
	} {
		got, err := record.ParseStart("start", tt.in, true)
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.want, got, tt.in)
	}
	_, err := record.ParseStart("start", "(10-1000", false)
	require.ErrorContains(t, err, "start")
	_, err = record.ParseStart("start", "(bad", true)
	require.ErrorContains(t, err, `start: invalid record id "bad"`)
	for _, bad := range []string{"@", "@7", "@7.", "@7.-1", "@7.x", "@7.+1", "@7..2"} {
		_, err = record.ParseStart("start", bad, true)
		require.ErrorContains(t, err, "not a read cursor", bad)
	}
	_, err = record.ParseStart("start", "@7.1", false)
	require.ErrorContains(t, err, "invalid record id", "groups start at ids, not cursors")

	after := record.Start{Kind: record.AfterID, ID: id}
	require.False(t, after.Includes(id))
	require.True(t, after.Includes(record.NewID(10, 0, 2)))
	end, err := record.ParseEnd("end", "+")
	require.NoError(t, err)
	require.True(t, end.Open)
	end, err = record.ParseEnd("end", "10-1000")
	require.NoError(t, err)
	require.True(t, end.Includes(id))
	require.False(t, end.Includes(record.NewID(11, 0, 0)))
}
