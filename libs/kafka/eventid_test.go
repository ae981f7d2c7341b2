package kafka_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/kafka"
)

// Event ids are random (version 4, RFC 4122) UUIDs, never one twice.
func TestEventIDsAreDistinctVersion4UUIDs(t *testing.T) {
	seen := map[uuid.UUID]bool{}
	for range 10_000 {
		id := kafka.NewEventID()
		require.Equal(t, uuid.Version(4), id.Version())
		require.Equal(t, uuid.RFC4122, id.Variant())
		require.False(t, seen[id], "event id %s given twice", id)
		seen[id] = true
	}
}
