package page_test

import (
	"encoding/base64"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/page"
)

func TestNew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		limit     int32
		token     string
		wantLimit int
		wantAfter []string
		wantErr   string
	}{
		{name: "zero limit is the default", wantLimit: page.DefaultLimit},
		{name: "the maximum is allowed", limit: 50, wantLimit: 50},
		{name: "above the maximum", limit: 51, wantErr: "limit must be between 0 and 50, got 51"},
		{name: "negative", limit: -1, wantErr: "limit must be between 0 and 50, got -1"},
		{name: "a token made for the key", limit: 2, token: page.Token("b", "7"), wantLimit: 2, wantAfter: []string{"b", "7"}},
		{name: "not base64", token: "garbage!", wantErr: "page_token"},
		{name: "not a key", token: base64.RawURLEncoding.EncodeToString([]byte(`{"a":1}`)), wantErr: "page_token"},
		{name: "a key of another shape", token: page.Token("b"), wantErr: "page_token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := page.New(tc.limit, tc.token, 50, 2)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				var f *fault.Error
				require.True(t, errors.As(err, &f))
				require.Equal(t, fault.Invalid, f.Kind)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantLimit, p.Limit)
			require.Equal(t, tc.wantAfter, p.After)
		})
	}
}

// Cut keeps a page of the items fetched and makes the next token from the
// page's last item, which New reads back; a short fetch is the last page.
func TestCutAndResume(t *testing.T) {
	t.Parallel()
	items := []string{"a", "b", "c", "d", "e"}
	key := func(s string) []string { return []string{s} }
	var all []string
	p, err := page.New(2, "", page.MaxLimit, 1)
	require.NoError(t, err)
	for range len(items) {
		var fetched []string
		for _, it := range items {
			if it > p.Part(0) && len(fetched) < p.Fetch() {
				fetched = append(fetched, it)
			}
		}
		got, next := page.Cut(p, fetched, key)
		require.LessOrEqual(t, len(got), 2)
		all = append(all, got...)
		if next == "" {
			break
		}
		p, err = page.New(2, next, page.MaxLimit, 1)
		require.NoError(t, err)
	}
	require.Equal(t, items, all)

	p, err = page.New(0, page.Token("x"), page.MaxLimit, 1)
	require.NoError(t, err)
	_, err = p.Int(0)
	require.ErrorContains(t, err, "page_token")
}
