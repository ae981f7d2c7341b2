package definition_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/workflow/internal/definition"
)

// triggered is a one-step workflow named x with trigger written as body
// (indented fields), the trigger key on line 4.
func triggered(body string) string {
	return "kind: Workflow\nname: x\nversion: \"1\"\ntrigger:\n" + body +
		"start: {run: \"@actions/a\", transitions: {success: flo.Completed}}\n"
}

// triggerSeeds cover every trigger field, and broken triggers, for FuzzParse.
var triggerSeeds = []string{
	triggered("  stream: orders\n  namespace: prod\n  consumer_group: g\n  mode: key_shared\n  batch_size: 10\n"),
	triggered("  stream: _audit.v1\n  mode: exclusive\n"),
	triggered("  stream: a/b\n  namespace: \"\"\n  mode: keyed\n  batch_size: 0\n"),
	triggered("  stream: [orders]\n  batch_size: 1.5\n"),
	triggered("  {}\n"),
}

func TestOrderProcessorModel(t *testing.T) {
	t.Parallel()
	def, _ := parseFile(t, "order-processor.yaml")
	require.Equal(t, &definition.Trigger{
		Stream: "orders", Namespace: "prod", ConsumerGroup: "wf-orders",
		Mode: definition.TriggerShared, BatchSize: 1, Pos: definition.Position{Line: 4, Column: 1},
	}, def.Trigger)
	require.Equal(t, "prod", def.Trigger.StreamNamespace("default"))
}

func TestTriggerDefaults(t *testing.T) {
	t.Parallel()
	def, diags, err := definition.Parse([]byte(triggered("  stream: orders\n")))
	require.NoError(t, err, "%v", diags)
	require.Equal(t, &definition.Trigger{
		Stream: "orders", ConsumerGroup: "wf-x", Mode: definition.TriggerShared, BatchSize: 1,
		Pos: definition.Position{Line: 4, Column: 1},
	}, def.Trigger)
	require.Equal(t, "ns", def.Trigger.StreamNamespace("ns"), "the workflow's namespace unless the trigger names one")

	def, _, err = definition.Parse([]byte(triggerSeeds[0]))
	require.NoError(t, err)
	require.Equal(t, definition.TriggerKeyShared, def.Trigger.Mode)
	require.Equal(t, 10, def.Trigger.BatchSize)
	require.Equal(t, "g", def.Trigger.ConsumerGroup)

	none, _, err := definition.Parse([]byte("kind: Workflow\nname: x\nversion: \"1\"\nstart: {run: \"@actions/a\", transitions: {success: flo.Completed}}\n"))
	require.NoError(t, err)
	require.Nil(t, none.Trigger)
}

// TestTriggerSeeds checks the broken seeds are refused with trigger codes.
func TestTriggerSeeds(t *testing.T) {
	t.Parallel()
	for i, src := range triggerSeeds[2:] {
		_, diags, err := definition.Parse([]byte(src))
		require.Error(t, err, "seed %d", i+2)
		require.NotEmpty(t, diags)
	}
}
