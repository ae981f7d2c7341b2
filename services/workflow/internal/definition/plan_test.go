package definition_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

func TestCacheKeyRender(t *testing.T) {
	t.Parallel()
	c := &mapping.Context{
		Step:  definition.StartStep,
		RunID: "run-7",
		Input: json.RawMessage(`{"customer_id":"c-1","n":42,"ok":true,"o":{"a":[1,"x"]},"nothing":null,"items":["a","b"]}`),
		Steps: map[string]mapping.StepResult{"lookup": {Outcome: "success", Output: json.RawMessage(`{"id":"L-9"}`)}},
	}
	tests := []struct {
		name, src, want string
		wantOK          bool
	}{
		{"literal only", "static-key", "static-key", true},
		{"several placeholders", "c:{input.customer_id}:{steps.lookup.output.id}:{flo.run_id}:{steps.lookup.outcome}", "c:c-1:L-9:run-7:success", true},
		{"placeholder alone", "{input.customer_id}", "c-1", true},
		{"number goes in as its JSON text", "n={input.n}", "n=42", true},
		{"boolean goes in as its JSON text", "{input.ok}", "true", true},
		{"object goes in as its JSON text", "o={input.o}", `o={"a":[1,"x"]}`, true},
		{"indexed element", "{input.items[1]}", "b", true},
		{"bracket name", "{input['customer_id']}", "c-1", true},
		{"missing field is not cached", "c:{input.absent}", "", false},
		{"null is not cached", "c:{input.nothing}", "", false},
		{"step that has not run is not cached", "{steps.later.output.id}", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := definition.CompileCacheKey(tt.src)
			require.NoError(t, err)
			require.Equal(t, tt.src, k.String())
			got, ok := k.Render(c)
			require.Equal(t, tt.wantOK, ok)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestCompileCacheKeyErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, src, contains string }{
		{"unclosed brace", "c:{input.id", "a '{' that is never closed"},
		{"closing brace first", "c:}{input.id}", "a '}' with no '{' before it"},
		{"wildcard selects several", "c:{input.items[*]}", "can select several values"},
		{"filter selects several", "c:{input.items[?(@.a == 1)]}", "can select several values"},
		{"unknown root", "c:{nope.id}", "placeholder {nope.id}"},
		{"empty placeholder", "c:{}", "placeholder {}"},
		{"flo field the language lacks", "{flo.namespace}", "$.flo has only run_id and timestamp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := definition.CompileCacheKey(tt.src)
			require.Error(t, err)
			require.Nil(t, k)
			require.Contains(t, err.Error(), tt.contains)
		})
	}
}

// TestPlanSeeds checks the fuzz seeds do what they are there for: the first
// sets every plan field and is valid, the others are broken.
func TestPlanSeeds(t *testing.T) {
	t.Parallel()
	def, diags, err := definition.Parse([]byte(planSeeds[0]))
	require.NoError(t, err, "%v", diags)
	require.Empty(t, diags)
	p, _ := def.Plan("p")
	require.Equal(t, definition.SelectRoundRobin, p.Selection)
	a := p.Executors[0]
	require.Equal(t, -3, a.Priority)
	require.Equal(t, &definition.RateLimit{PerSecond: 1, PerMinute: 10, PerHour: 100}, a.RateLimit)
	require.Equal(t, definition.Tracking{Async: true, Timeout: time.Second}, a.Tracking)
	require.Equal(t, []string{"a.b", "c:d"}, p.Cache.InvalidateOn)
	require.Equal(t, json.RawMessage(`[1,{"a":null}]`), p.Fallback.Value)
	require.Equal(t, definition.FallbackAnyError, p.Fallback.Condition)
	require.Equal(t, definition.ErrorClasses{Retryable: []string{"t1"}, Fatal: []string{"f.1", "f:2"}}, p.Errors, "repeats are dropped")
	q, _ := def.Plan("q")
	require.Equal(t, &definition.Health{Window: time.Second, Decay: 1, MinSamples: 1}, q.Health)
	s, _ := def.Step("s")
	require.Equal(t, "@plan/q", s.Run.String())

	for i, src := range planSeeds[1:] {
		_, diags, err := definition.Parse([]byte(src))
		require.Error(t, err, "seed %d: %v", i+1, diags)
	}
}
