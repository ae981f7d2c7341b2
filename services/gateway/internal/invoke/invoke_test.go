package invoke

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func TestTaskIDs(t *testing.T) {
	a, err := NewTaskID("ns", "act", "key")
	require.NoError(t, err)
	b, err := NewTaskID("ns", "act", "key")
	require.NoError(t, err)
	require.Equal(t, a, b, "the same idempotency key names the same task")

	for _, other := range [][3]string{{"ns2", "act", "key"}, {"ns", "act2", "key"}, {"ns", "act", "key2"}, {"ns\x00act", "", "key"}} {
		id, err := NewTaskID(other[0], other[1], other[2])
		require.NoError(t, err)
		require.NotEqual(t, a, id, "%q", other)
	}

	fresh, err := NewTaskID("ns", "act", "")
	require.NoError(t, err)
	parsed, err := uuid.Parse(fresh)
	require.NoError(t, err)
	require.Equal(t, uuid.Version(7), parsed.Version())
	again, err := NewTaskID("ns", "act", "")
	require.NoError(t, err)
	require.NotEqual(t, fresh, again)
}
