package runner

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/workflow/internal/definition"
)

// The workflow service checks an invalidation itself, for callers of its
// internal API that skip the gateway; a refused one reaches no database.
func TestInvalidatePlanCacheRefusesBadArguments(t *testing.T) {
	t.Parallel()
	r := &Runner{} // no pool: a check that let the call through would panic
	tests := []struct {
		name, namespace, event, key, msg string
	}{
		{name: "no namespace", event: "payment.refunded", msg: "namespace is required"},
		{name: "no event", namespace: "ns", msg: "event is required"},
		{name: "malformed event", namespace: "ns", event: ":refunded", msg: `event ":refunded" is invalid`},
		{name: "key with NUL", namespace: "ns", event: "payment.refunded", key: "a\x00b", msg: "key must not contain NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := r.InvalidatePlanCache(t.Context(), tt.namespace, tt.event, tt.key)
			kind, msg, ok := fault.KindOf(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, fault.Invalid, kind)
			require.Contains(t, msg, tt.msg)
		})
	}
}

func TestPlansInDefinitionOrder(t *testing.T) {
	t.Parallel()
	plans := map[string]*definition.Plan{
		"zeta":  {Name: "zeta", Pos: definition.Position{Line: 3, Column: 3}},
		"alpha": {Name: "alpha", Pos: definition.Position{Line: 20, Column: 3}},
		"mid":   {Name: "mid", Pos: definition.Position{Line: 9, Column: 3}},
	}
	var names []string
	for _, p := range inOrder(plans) {
		names = append(names, p.Name)
	}
	require.Equal(t, []string{"zeta", "mid", "alpha"}, names)
}
