package streamname

import (
	"testing"

	"github.com/stretchr/testify/require"
)

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
