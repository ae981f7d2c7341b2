package keyformat_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/keyformat"
)

func TestGenerateParses(t *testing.T) {
	t.Parallel()
	k, err := keyformat.Generate()
	require.NoError(t, err)
	require.Regexp(t, `^flo_[a-z2-7]{12}_[0-9a-f]{64}$`, k.String())
	back, err := keyformat.Parse(k.String())
	require.NoError(t, err)
	require.Equal(t, k, back)
	other, err := keyformat.Generate()
	require.NoError(t, err)
	require.NotEqual(t, k.ID, other.ID)
	require.NotEqual(t, keyformat.Hash(k.Secret), keyformat.Hash(other.Secret))
	require.Len(t, keyformat.Hash(k.Secret), 32)
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	good := "flo_abcdefgh2345_" + strings.Repeat("0a", 32)
	_, err := keyformat.Parse(good)
	require.NoError(t, err)
	for _, tc := range []struct{ name, key string }{
		{"empty", ""},
		{"no prefix", strings.TrimPrefix(good, "flo_")},
		{"other prefix", "flx_" + strings.TrimPrefix(good, "flo_")},
		{"short secret", good[:len(good)-1]},
		{"long secret", good + "0"},
		{"upper id", "flo_ABCDEFGH2345_" + strings.Repeat("0a", 32)},
		{"id digit out of alphabet", "flo_abcdefgh2341_" + strings.Repeat("0a", 32)},
		{"upper hex", "flo_abcdefgh2345_" + strings.Repeat("0A", 32)},
		{"no separator", "flo_abcdefgh2345-" + strings.Repeat("0a", 32)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := keyformat.Parse(tc.key)
			require.ErrorIs(t, err, keyformat.ErrMalformed)
		})
	}
}
