package view_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/dispatcher/internal/view"
)

func TestPayloads(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, _ := newMaterializer(t, pool, nil)
	ctx := t.Context()

	a, b := queued("ns"), queued("ns")
	a.Payload, b.Payload = []byte(`{"a":1}`), []byte(`{"b":2}`)
	m.Add(view.Entry{Partition: 1, Offset: 0, Task: a}, view.Entry{Partition: 1, Offset: 1, Task: b})
	require.NoError(t, m.Flush(ctx))
	// A later state without the payload, as claims record, keeps it.
	claimed := running(a)
	claimed.Payload = nil
	m.Add(view.Entry{Partition: 1, Offset: 2, Task: claimed})
	require.NoError(t, m.Flush(ctx))

	got, err := view.Payloads(ctx, pool, []uuid.UUID{a.ID, b.ID, uuid.New()})
	require.NoError(t, err)
	require.Equal(t, map[uuid.UUID][]byte{a.ID: a.Payload, b.ID: b.Payload}, got)
}
