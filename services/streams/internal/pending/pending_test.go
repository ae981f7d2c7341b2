package pending_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/streams/internal/pending"
)

func TestNewSettlesMissingOffsets(t *testing.T) {
	t.Parallel()
	r := pending.New(7, 2, []int64{10, 11, 14}, []int64{100, 101, 104})
	require.Equal(t, int64(10), r.First)
	require.Equal(t, int64(14), r.Last)
	require.Equal(t, 3, r.Unsettled)
	require.Equal(t, []int64{10, 11, 14}, r.Open())
	require.True(t, r.IsSettled(12))
	require.Equal(t, int64(104), r.Stamp(14))
	require.Equal(t, int64(101), r.Stamp(12), "a missing offset repeats its predecessor's time")
}

func TestSettle(t *testing.T) {
	t.Parallel()
	offsets := make([]int64, 20)
	for i := range offsets {
		offsets[i] = int64(100 + i)
	}
	r := pending.New(1, 0, offsets, make([]int64, 20))
	require.True(t, r.Settle(105))
	require.False(t, r.Settle(105), "settling twice counts once")
	require.True(t, r.Settle(119))
	require.Equal(t, 18, r.Unsettled)
	require.NotContains(t, r.Open(), int64(105))
	require.NotContains(t, r.Open(), int64(119))
	require.Len(t, r.Open(), 18)
}

func TestSplit(t *testing.T) {
	t.Parallel()
	offsets := []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	stamps := []int64{50, 50, 51, 51, 52, 52, 53, 53, 54, 54}
	base := pending.New(3, 1, offsets, stamps)
	base.ID, base.Consumer, base.Deliveries = 99, "c1", 2

	for _, tt := range []struct {
		name   string
		settle []int64
		owner  map[int64]int
		want   [][3]int64 // owner, first, last
	}{
		{"one owner keeps the whole range", nil, nil, [][3]int64{{0, 0, 9}}},
		{"settled ends are trimmed", []int64{0, 1, 9}, nil, [][3]int64{{0, 2, 8}}},
		{"a middle run is cut out", nil, map[int64]int{3: 1, 4: 1}, [][3]int64{{0, 0, 2}, {1, 3, 4}, {0, 5, 9}}},
		{"settled records stay inside a run", []int64{4}, map[int64]int{3: 1, 5: 1}, [][3]int64{{0, 0, 2}, {1, 3, 5}, {0, 6, 9}}},
		{"two owners", nil, map[int64]int{0: 2, 9: 1}, [][3]int64{{2, 0, 0}, {0, 1, 8}, {1, 9, 9}}},
		{"everything settled", offsets, nil, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := base
			r.Settled = append([]byte(nil), base.Settled...)
			for _, off := range tt.settle {
				r.Settle(off)
			}
			pieces := r.Split(func(off int64) int { return tt.owner[off] })
			var got [][3]int64
			total := 0
			for _, p := range pieces {
				got = append(got, [3]int64{int64(p.Owner), p.Range.First, p.Range.Last})
				require.Zero(t, p.Range.ID, "pieces are new rows")
				require.Equal(t, "c1", p.Range.Consumer)
				require.Equal(t, 2, p.Range.Deliveries)
				require.Len(t, p.Range.Stamps, p.Range.Len())
				require.Equal(t, stamps[p.Range.First], p.Range.Stamps[0])
				require.Len(t, p.Range.Open(), p.Range.Unsettled)
				total += p.Range.Unsettled
			}
			require.Equal(t, tt.want, got)
			require.Equal(t, r.Unsettled, total, "no record is lost or doubled")
		})
	}
}

func TestStampsRoundTrip(t *testing.T) {
	t.Parallel()
	in := []int64{1_700_000_000_000, 1_700_000_000_000, 1_700_000_000_003, 1_699_999_999_999, 0}
	b := pending.EncodeStamps(in)
	out, err := pending.DecodeStamps(b, len(in))
	require.NoError(t, err)
	require.Equal(t, in, out)
	_, err = pending.DecodeStamps(b[:len(b)-1], len(in))
	require.Error(t, err)
	_, err = pending.DecodeStamps(b, len(in)-1)
	require.Error(t, err)
}
