package roster

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/registry/internal/store"
)

func TestNormalizeDefaults(t *testing.T) {
	t.Parallel()
	r := store.Registration{
		Namespace: "ns", Type: store.StreamWorker, Metadata: "  ",
		Processes: []store.Process{{Name: "s/g", RunCount: 5}, {Name: "a", Kind: store.ActionProcess}},
	}
	generated, err := normalize(&r)
	require.NoError(t, err)
	require.True(t, generated)
	require.Regexp(t, `^worker-[0-9a-f]{8}$`, r.ID)
	require.Equal(t, int32(DefaultMaxConcurrency), r.MaxConcurrency)
	require.Empty(t, r.Metadata)
	require.Equal(t, []store.Process{{Name: "s/g", Kind: store.StreamProcess}, {Name: "a", Kind: store.ActionProcess}}, r.Processes)
}

func TestNormalizeLimits(t *testing.T) {
	t.Parallel()
	ok := func() store.Registration {
		return store.Registration{Namespace: "ns", ID: "w", Type: store.ActionWorker}
	}
	r := ok()
	r.ID = "A1.b_c:d-"
	_, err := normalize(&r)
	require.NoError(t, err)

	r = ok()
	r.MaxConcurrency = MaxConcurrencyLimit
	_, err = normalize(&r)
	require.NoError(t, err)

	r = ok()
	r.Metadata = `{"a":"` + strings.Repeat("x", MaxMetadataBytes-8) + `"}`
	require.Len(t, r.Metadata, MaxMetadataBytes)
	_, err = normalize(&r)
	require.NoError(t, err, "exactly the limit is fine")

	r = ok()
	r.MachineID = strings.Repeat("m", MaxMachineIDBytes+1)
	_, err = normalize(&r)
	require.ErrorContains(t, err, "machine_id")
}

func TestNormalizeRefusesUnstorableText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		edit  func(r *store.Registration)
		field string
	}{
		{name: "worker id NUL", edit: func(r *store.Registration) { r.ID = "w\x00" }, field: "worker_id"},
		{name: "namespace NUL", edit: func(r *store.Registration) { r.Namespace = "ns\x00" }, field: "namespace"},
		{name: "machine id NUL", edit: func(r *store.Registration) { r.MachineID = "m\x00" }, field: "machine_id"},
		{name: "metadata invalid UTF-8", edit: func(r *store.Registration) { r.Metadata = "{\"a\":\"\xff\"}" }, field: "metadata"},
		{name: "process name NUL", edit: func(r *store.Registration) { r.Processes = []store.Process{{Name: "a\x00"}} }, field: "processes[0].name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := store.Registration{Namespace: "ns", ID: "w", Type: store.ActionWorker}
			tt.edit(&r)
			_, err := normalize(&r)
			require.ErrorContains(t, err, tt.field)
		})
	}
}
