package millis_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/millis"
)

func TestDuration(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ms   int64
		want time.Duration
	}{
		{name: "zero", ms: 0, want: 0},
		{name: "ordinary", ms: 1500, want: 1500 * time.Millisecond},
		{name: "negative", ms: -5, want: -5 * time.Millisecond},
		{name: "huge saturates", ms: math.MaxInt64, want: math.MaxInt64},
		{name: "just past the limit saturates", ms: math.MaxInt64/int64(time.Millisecond) + 1, want: math.MaxInt64},
		{name: "hugely negative saturates", ms: math.MinInt64, want: -math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, millis.Duration(tt.ms))
		})
	}
}
