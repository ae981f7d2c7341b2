package flo

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// listPages follows next tokens to the end, asks for no more than the rest of a limit, and
// stops on a server that hands back the token it was sent.
func TestListPages(t *testing.T) {
	t.Parallel()
	items := make([]int, 2500)
	for i := range items {
		items[i] = i
	}
	// server pages items by index, as the List calls page by key.
	server := func(sizes *[]int32) func(int32, string) ([]int, string, error) {
		return func(size int32, token string) ([]int, string, error) {
			*sizes = append(*sizes, size)
			from := 0
			if token != "" {
				from, _ = strconv.Atoi(token)
			}
			to := min(from+int(size), len(items))
			next := ""
			if to < len(items) {
				next = strconv.Itoa(to)
			}
			return items[from:to], next, nil
		}
	}
	double := func(i int) int { return 2 * i }

	tests := []struct {
		name      string
		limit     int
		wantLen   int
		wantSizes []int32
	}{
		{name: "no limit fetches every page", limit: 0, wantLen: 2500, wantSizes: []int32{1000, 1000, 1000}},
		{name: "a limit within a page", limit: 20, wantLen: 20, wantSizes: []int32{20}},
		{name: "a limit across pages", limit: 1500, wantLen: 1500, wantSizes: []int32{1000, 500}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var sizes []int32
			got, err := listPages(tc.limit, server(&sizes), double)
			require.NoError(t, err)
			require.Len(t, got, tc.wantLen)
			for i, v := range got {
				require.Equal(t, 2*i, v)
			}
			require.Equal(t, tc.wantSizes, sizes)
		})
	}

	stuck := func(int32, string) ([]int, string, error) { return []int{1}, "same", nil }
	_, err := listPages(0, stuck, double)
	require.ErrorContains(t, err, "page token")
}
