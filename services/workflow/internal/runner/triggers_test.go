package runner

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKeepClaimedDropsThePayloadsOfRecordsWithRuns(t *testing.T) {
	t.Parallel()
	input := json.RawMessage(`[{"i": 0}, "text", {"i": 2}]`)
	records := []string{"1-0", "1-1", "1-2"}
	got, err := keepClaimed(input, records, map[string]bool{"1-1": true, "1-2": true})
	require.NoError(t, err)
	require.JSONEq(t, `["text", {"i": 2}]`, string(got))

	_, err = keepClaimed(input, records[:2], map[string]bool{"1-1": true})
	require.ErrorContains(t, err, "not an array of as many payloads")
}
