package harness

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// HTTPGet gets url (a service's probe or metrics) and returns the status
// code and body.
func HTTPGet(tb testing.TB, url string) (code int, body string) {
	tb.Helper()
	resp, err := http.Get(url)
	require.NoError(tb, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	return resp.StatusCode, string(b)
}
