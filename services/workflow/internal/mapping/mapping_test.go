package mapping_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

func testContext() *mapping.Context {
	return &mapping.Context{
		Step:  "charge",
		RunID: "wfrun-42",
		Now:   time.UnixMilli(1_700_000_000_123),
		Input: json.RawMessage(`{"order_id":"ORD-123","amount":99.99,"customer":{"id":"c-1","tags":["vip","eu"]},"items":[{"sku":"a","qty":2},{"sku":"b","qty":5}],"order-ref":"R1","big":12345678901234567890}`),
		Steps: map[string]mapping.StepResult{
			mapping.StartStep: {Outcome: "success", Output: json.RawMessage(`{"payment_id":"pay-7","ok":true}`)},
			"enrich":          {Outcome: "success", Output: json.RawMessage(`{"email":"a@b.co","score":null,"nested":{"list":[1,2,3]}}`)},
			"check-stock":     {Outcome: "out_of_stock", Output: json.RawMessage(`"short"`)},
			"silent":          {Outcome: "success"},
		},
	}
}

func resolve(t *testing.T, tmpl string) (string, error) {
	t.Helper()
	compiled, err := mapping.Compile(tmpl)
	require.NoError(t, err)
	out, err := compiled.Resolve(testContext())
	if err != nil {
		return "", err
	}
	require.True(t, json.Valid(out), "output %s is not JSON", out)
	return string(out), nil
}

func TestResolveEveryForm(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		tmpl string
		want string
	}{
		{"whole input", `{"in":"$.input"}`, `{"in":{"amount":99.99,"big":12345678901234567890,"customer":{"id":"c-1","tags":["vip","eu"]},"items":[{"qty":2,"sku":"a"},{"qty":5,"sku":"b"}],"order-ref":"R1","order_id":"ORD-123"}}`},
		{"input field", `{"id":"$.input.order_id"}`, `{"id":"ORD-123"}`},
		{"input number keeps its value", `{"amount":"$.input.amount"}`, `{"amount":99.99}`},
		{"input big number keeps its digits", `{"n":"$.input.big"}`, `{"n":12345678901234567890}`},
		{"input nested field", `{"c":"$.input.customer.id"}`, `{"c":"c-1"}`},
		{"input array index", `{"t":"$.input.customer.tags[1]"}`, `{"t":"eu"}`},
		{"input negative index", `{"t":"$.input.items[-1].sku"}`, `{"t":"b"}`},
		{"input bracket name", `{"r":"$.input['order-ref']"}`, `{"r":"R1"}`},
		{"input wildcard is an array", `{"skus":"$.input.items[*].sku"}`, `{"skus":["a","b"]}`},
		{"input filter", `{"big":"$.input.items[?(@.qty > 3)].sku"}`, `{"big":["b"]}`},
		{"wildcard matching nothing is empty", `{"none":"$.input.missing[*]"}`, `{"none":[]}`},
		{"step output", `{"o":"$.steps.enrich.output"}`, `{"o":{"email":"a@b.co","nested":{"list":[1,2,3]},"score":null}}`},
		{"step output field", `{"email":"$.steps.enrich.output.email"}`, `{"email":"a@b.co"}`},
		{"step output deep index", `{"x":"$.steps.enrich.output.nested.list[2]"}`, `{"x":3}`},
		{"step output null field", `{"s":"$.steps.enrich.output.score"}`, `{"s":null}`},
		{"step output scalar", `{"s":"$.steps.check-stock.output"}`, `{"s":"short"}`},
		{"step with empty output is null", `{"s":"$.steps.silent.output"}`, `{"s":null}`},
		{"start step output", `{"p":"$.steps._start.output.payment_id"}`, `{"p":"pay-7"}`},
		{"step outcome", `{"o":"$.steps.enrich.outcome"}`, `{"o":"success"}`},
		{"named outcome", `{"o":"$.steps.check-stock.outcome"}`, `{"o":"out_of_stock"}`},
		{"run id", `{"id":"$.flo.run_id"}`, `{"id":"wfrun-42"}`},
		{"timestamp", `{"ts":"$.flo.timestamp"}`, `{"ts":1700000000123}`},
		{"literals pass through", `{"template":"payment_success","n":1.50,"b":true,"z":null,"dollar":"$5","bare":"$","html":"<a&b>"}`, `{"template":"payment_success","n":1.50,"b":true,"z":null,"dollar":"$5","bare":"$","html":"<a&b>"}`},
		{"key order kept", `{"z":"$.flo.run_id","a":1,"m":"$.input.order_id"}`, `{"z":"wfrun-42","a":1,"m":"ORD-123"}`},
		{"nested template", `{"outer":{"list":["$.input.order_id",{"o":"$.steps._start.outcome"}]}}`, `{"outer":{"list":["ORD-123",{"o":"success"}]}}`},
		{"top-level path", `"$.input.customer"`, `{"id":"c-1","tags":["vip","eu"]}`},
		{"top-level array", `["$.flo.run_id", 7]`, `["wfrun-42",7]`},
		{"reference example enrich", `{"customer_id": "$.input.customer.id", "domain": "$.input.order_id"}`, `{"customer_id":"c-1","domain":"ORD-123"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := resolve(t, tt.tmpl)
			require.NoError(t, err)
			require.JSONEq(t, tt.want, got)
			if tt.name == "key order kept" || tt.name == "literals pass through" {
				require.Equal(t, tt.want, got)
			}
		})
	}
}

func TestResolveMissingIsAClearError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		tmpl    string
		path    string
		message string
	}{
		{"missing input field", `{"x":"$.input.nope"}`, "$.input.nope", `step "charge": inputMapping path "$.input.nope": the run input has no value at .nope`},
		{"index out of range", `{"x":"$.input.items[9].sku"}`, "$.input.items[9].sku", `step "charge": inputMapping path "$.input.items[9].sku": the run input has no value at .items[9].sku`},
		{"field of a scalar", `{"x":"$.input.order_id.deeper"}`, "$.input.order_id.deeper", `step "charge": inputMapping path "$.input.order_id.deeper": the run input has no value at .order_id.deeper`},
		{"step not run", `{"x":"$.steps.ship.output"}`, "$.steps.ship.output", `step "charge": inputMapping path "$.steps.ship.output": step "ship" has not run`},
		{"outcome of step not run", `{"x":"$.steps.ship.outcome"}`, "$.steps.ship.outcome", `step "charge": inputMapping path "$.steps.ship.outcome": step "ship" has not run`},
		{"missing output field", `{"x":"$.steps.enrich.output.phone"}`, "$.steps.enrich.output.phone", `step "charge": inputMapping path "$.steps.enrich.output.phone": the output of step "enrich" has no value at .phone`},
		{"field of empty output", `{"x":"$.steps.silent.output.a"}`, "$.steps.silent.output.a", `step "charge": inputMapping path "$.steps.silent.output.a": the output of step "silent" has no value at .a`},
		{"nested missing in array", `{"a":["$.input.order_id","$.input.gone"]}`, "$.input.gone", `step "charge": inputMapping path "$.input.gone": the run input has no value at .gone`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := resolve(t, tt.tmpl)
			var re *mapping.ResolveError
			require.ErrorAs(t, err, &re)
			require.Equal(t, "charge", re.Step)
			require.Equal(t, tt.path, re.Path)
			require.Equal(t, tt.message, err.Error())
		})
	}
}

func TestResolveBadDocuments(t *testing.T) {
	t.Parallel()
	c := testContext()
	c.Input = json.RawMessage(`{"broken":`)
	c.Steps["enrich"] = mapping.StepResult{Outcome: "success", Output: json.RawMessage(`not json`)}
	for _, tmpl := range []string{`{"x":"$.input.broken"}`, `{"x":"$.steps.enrich.output"}`} {
		compiled, err := mapping.Compile(tmpl)
		require.NoError(t, err)
		_, err = compiled.Resolve(c)
		var re *mapping.ResolveError
		require.ErrorAs(t, err, &re, tmpl)
		require.Contains(t, re.Problem, "not valid JSON")
	}
}

func TestResolveEmptyInputIsNull(t *testing.T) {
	t.Parallel()
	compiled, err := mapping.Compile(`{"in":"$.input"}`)
	require.NoError(t, err)
	out, err := compiled.Resolve(&mapping.Context{Step: "s"})
	require.NoError(t, err)
	require.JSONEq(t, `{"in":null}`, string(out))
}

func TestCompileErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		tmpl    string
		problem string
	}{
		{"not JSON", `{"a": $.input}`, "is not valid JSON"},
		{"truncated", `{"a": "$.input"`, "is not valid JSON"},
		{"empty", ``, "is not valid JSON"},
		{"two values", `{} {}`, "single JSON value"},
		{"duplicate key", `{"a":1,"a":2}`, `has the key "a" twice`},
		{"unknown root", `{"a":"$.inputs"}`, "must be one of"},
		{"unknown root 2", `{"a":"$.run.id"}`, "must be one of"},
		{"flo unknown field", `{"a":"$.flo.namespace"}`, "$.flo has only run_id and timestamp"},
		{"flo below run id", `{"a":"$.flo.run_id.x"}`, "$.flo has only run_id and timestamp"},
		{"steps without name", `{"a":"$.steps"}`, "must name a step"},
		{"steps bracket", `{"a":"$.steps['x'].output"}`, "must name a step"},
		{"step without field", `{"a":"$.steps.enrich"}`, "continues with .output or .outcome"},
		{"step bad field", `{"a":"$.steps.enrich.result"}`, "continues with .output or .outcome"},
		{"below outcome", `{"a":"$.steps.enrich.outcome.x"}`, "continues with .output or .outcome"},
		{"bad step name", `{"a":"$.steps.9lives.output"}`, "is not a step name"},
		{"empty step name", `{"a":"$.steps..output"}`, "is not a step name"},
		{"dangling dot", `{"a":"$.input."}`, "invalid JSONPath"},
		{"open bracket", `{"a":"$.input.items["}`, "invalid JSONPath"},
		{"too deep", deep(MaxDepthPlus()), "nests deeper"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := mapping.Compile(tt.tmpl)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.problem)
		})
	}
}

func MaxDepthPlus() int { return mapping.MaxDepth + 2 }

func deep(n int) string {
	s := `"$.input"`
	for range n {
		s = "[" + s + "]"
	}
	return s
}

func TestPaths(t *testing.T) {
	t.Parallel()
	compiled, err := mapping.Compile(`{"a":"$.input.x","b":["$.steps.enrich.output.email",{"c":"$.steps._start.outcome"}],"d":"$.flo.timestamp","e":"lit"}`)
	require.NoError(t, err)
	type ref struct {
		path string
		root mapping.Root
		step string
	}
	var got []ref
	for _, p := range compiled.Paths() {
		got = append(got, ref{p.String(), p.Root(), p.Step()})
	}
	require.Equal(t, []ref{
		{"$.input.x", mapping.RootInput, ""},
		{"$.steps.enrich.output.email", mapping.RootStepOutput, "enrich"},
		{"$.steps._start.outcome", mapping.RootStepOutcome, mapping.StartStep},
		{"$.flo.timestamp", mapping.RootTimestamp, ""},
	}, got)
}

func TestParsePathSingular(t *testing.T) {
	t.Parallel()
	tests := []struct {
		path     string
		singular bool
	}{
		{"$.input", true},
		{"$.input.a.b[3]", true},
		{"$.input['a b'][0]", true},
		{"$.input.a[*]", false},
		{"$.input..a", false},
		{"$.input.a[0:2]", false},
		{"$.input.a[0,1]", false},
		{"$.steps.x.output[?(@.n == 1)]", false},
		{"$.steps.x.output", true},
		{"$.steps.x.outcome", true},
		{"$.flo.run_id", true},
		{"$.flo.timestamp", true},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			t.Parallel()
			p, err := mapping.ParsePath(tt.path)
			require.NoError(t, err)
			require.Equal(t, tt.singular, p.Singular())
		})
	}
	_, err := mapping.ParsePath("input.a")
	require.ErrorContains(t, err, "must start with $.")
}

func FuzzResolve(f *testing.F) {
	seeds := []struct{ tmpl, input, output string }{
		{`{"id":"$.input.order_id","amount":"$.input.amount"}`, `{"order_id":"x","amount":1}`, `{}`},
		{`{"e":"$.steps.enrich.output.email","o":"$.steps.enrich.outcome"}`, `{}`, `{"email":"a"}`},
		{`{"p":"$.steps._start.output.payment_id","r":"$.flo.run_id","t":"$.flo.timestamp"}`, `null`, `{"payment_id":1}`},
		{`["$.input.items[*].sku","$.input..qty","$.input.items[0:1]"]`, `{"items":[{"sku":"a","qty":1}]}`, `[]`},
		{`{"f":"$.input.items[?(@.qty > 1)]"}`, `{"items":[{"qty":2}]}`, `1`},
		{`"$.steps.enrich.output[-1]"`, `""`, `[1,2,3]`},
		{`{"a":{"b":["$.input['k-1']"]}}`, `{"k-1":true}`, ``},
		{`{"bad":"$.input.["}`, `{`, `}`},
		{`["$.input","$.input","$.input","$.input"]`, `"` + strings.Repeat("x", 300_000) + `"`, `{}`},
		{`"$.input[0,0,0,0][0,0,0,0][0,0,0,0][0,0,0,0][0,0,0,0]"`, `[[[[[1]]]]]`, `{}`},
		{`"$.steps.enrich.output..*..*..*"`, `{}`, `[[[[1,2]]],[[[3]]]]`},
	}
	for _, s := range seeds {
		f.Add(s.tmpl, s.input, s.output)
	}
	f.Fuzz(func(t *testing.T, tmpl, input, output string) {
		compiled, err := mapping.Compile(tmpl)
		if err != nil {
			return
		}
		out, err := compiled.Resolve(&mapping.Context{
			Step:  "fuzz",
			RunID: "wfrun-1",
			Now:   time.UnixMilli(1),
			Input: json.RawMessage(input),
			Steps: map[string]mapping.StepResult{
				"enrich":          {Outcome: "success", Output: json.RawMessage(output)},
				mapping.StartStep: {Outcome: "success", Output: json.RawMessage(output)},
			},
		})
		if err != nil {
			var re *mapping.ResolveError
			require.ErrorAs(t, err, &re)
			return
		}
		require.True(t, json.Valid(out), "template %q resolved to invalid JSON %q", tmpl, out)
	})
}

// TestResolveStopsAtTheLimit covers every way a template expands user input:
// each must fail with a ResolveError once the input would pass the bound,
// and an input exactly at the bound still resolves.
func TestResolveStopsAtTheLimit(t *testing.T) {
	t.Parallel()
	const limit = 4096
	manyInputs := `[` + strings.Repeat(`"$.input",`, 20_000) + `"$.input"]`
	unions := `"$.input` + strings.Repeat(`[0,0,0,0,0,0,0,0,0,0]`, 8) + `"`
	nested := strings.Repeat(`[`, 8) + `1` + strings.Repeat(`]`, 8)
	tests := []struct {
		name    string
		tmpl    string
		input   string
		problem string
	}{
		{"a path repeated", manyInputs, `{"order":"ORD-123"}`, `inputMapping path "$.input": makes the input grow past the payload limit of 4096 bytes`},
		{"literals", `[` + strings.Repeat(`"literal text",`, 400) + `1]`, `{}`, `inputMapping resolves to more than 4096 bytes, the payload limit`},
		{"a wildcard over a large array", `"$.input[*]"`, `[` + strings.Repeat(`1,`, 3000) + `1]`, `inputMapping path "$.input[*]": makes the input grow past the payload limit`},
		{"unions selecting a value many times", unions, nested, `inputMapping path "` + unions[1:len(unions)-1] + `": makes the input grow past the payload limit`},
		{"recursive descent repeated", `"$.input..*..*..*..*"`, `[` + strings.Repeat(nested+`,`, 50) + `1]`, `inputMapping path "$.input..*..*..*..*": makes the input grow past the payload limit`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			compiled, err := mapping.Compile(tt.tmpl)
			require.NoError(t, err)
			c := testContext()
			c.Input, c.MaxBytes = json.RawMessage(tt.input), limit
			_, err = compiled.Resolve(c)
			var re *mapping.ResolveError
			require.ErrorAs(t, err, &re)
			require.ErrorContains(t, err, `step "charge": `+tt.problem)
		})
	}

	t.Run("exactly at the limit", func(t *testing.T) {
		t.Parallel()
		value := strings.Repeat("x", limit-2)
		compiled, err := mapping.Compile(`"$.input"`)
		require.NoError(t, err)
		c := testContext()
		c.Input, c.MaxBytes = json.RawMessage(`"`+value+`"`), limit
		out, err := compiled.Resolve(c)
		require.NoError(t, err)
		require.Len(t, out, limit)
		c.MaxBytes = limit - 1
		_, err = compiled.Resolve(c)
		require.ErrorContains(t, err, "past the payload limit of 4095 bytes")
	})

	t.Run("zero means the default", func(t *testing.T) {
		t.Parallel()
		compiled, err := mapping.Compile(`"$.input"`)
		require.NoError(t, err)
		c := testContext()
		c.Input = json.RawMessage(`"` + strings.Repeat("x", mapping.DefaultMaxBytes) + `"`)
		_, err = compiled.Resolve(c)
		require.ErrorContains(t, err, "past the payload limit of 1048576 bytes")
	})
}
