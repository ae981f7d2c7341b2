package definition_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/workflow/internal/definition"
)

// searched is a workflow whose searchAttributes section starts at line 5;
// body holds its entries from line 6.
func searched(body string) string {
	return `kind: Workflow
name: x
version: "1"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
searchAttributes:
` + body
}

func manyAttributes(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  - {name: a%d, type: number, from: input.a%d}\n", i, i)
	}
	return b.String()
}

// referenceAttributes is the reference's searchAttributes example.
const referenceAttributes = `  - name: customer_id
    type: string
    from: input.customer_id
  - name: order_amount
    type: number
    from: input.amount
  - name: created_at
    type: timestamp
    from: input.timestamp
`

func TestReferenceSearchAttributes(t *testing.T) {
	t.Parallel()
	def, diags, err := definition.Parse([]byte(searched(referenceAttributes + "  - {name: first_sku, type: string, from: \"$.input.items[0]['sku']\"}\n")))
	require.NoError(t, err)
	require.Empty(t, diags)
	require.Len(t, def.SearchAttributes, 4)
	a := def.SearchAttributes[1]
	require.Equal(t, "order_amount", a.Name)
	require.Equal(t, definition.AttributeNumber, a.Type)
	require.Equal(t, "$.input.amount", a.From.String())
	require.Equal(t, "9:5", a.Pos.String())
}

func TestSearchValues(t *testing.T) {
	t.Parallel()
	def, _, err := definition.Parse([]byte(searched(referenceAttributes)))
	require.NoError(t, err)
	when := time.Date(2026, 1, 31, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		input   string
		want    []definition.AttributeValue
		wantErr string
	}{
		{
			name:  "all three, timestamp as epoch milliseconds",
			input: fmt.Sprintf(`{"customer_id": "c-42", "amount": 120.5, "timestamp": %d}`, when.UnixMilli()),
			want: []definition.AttributeValue{
				{Name: "customer_id", Type: definition.AttributeString, Str: "c-42"},
				{Name: "order_amount", Type: definition.AttributeNumber, Num: 120.5},
				{Name: "created_at", Type: definition.AttributeTimestamp, Time: when},
			},
		},
		{
			name:  "timestamp as RFC 3339, missing and null values absent",
			input: `{"customer_id": null, "timestamp": "2026-01-31T13:00:00+01:00"}`,
			want:  []definition.AttributeValue{{Name: "created_at", Type: definition.AttributeTimestamp, Time: when}},
		},
		{name: "input not an object", input: `[1]`},
		{name: "string where a number is declared", input: `{"amount": "12"}`, wantErr: `search attribute order_amount (number, from $.input.amount): the string "12" is not a number`},
		{name: "number where a string is declared", input: `{"customer_id": 42}`, wantErr: "search attribute customer_id (string, from $.input.customer_id): the number 42 is not a string"},
		{name: "timestamp text that is not RFC 3339", input: `{"timestamp": "yesterday"}`, wantErr: `search attribute created_at (timestamp, from $.input.timestamp): "yesterday" is not an RFC 3339 timestamp`},
		{name: "timestamp as a boolean", input: `{"timestamp": true}`, wantErr: "the boolean true is not a timestamp"},
		{name: "number too large for a timestamp", input: `{"timestamp": 1e300}`, wantErr: "is not a timestamp"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := def.SearchValues(json.RawMessage(tc.input))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				kind, _, ok := fault.KindOf(err)
				require.True(t, ok && kind == fault.Invalid, "%v is Invalid", err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// searchSeeds cover every searchAttributes field, and broken ones, for
// FuzzParse.
var searchSeeds = []string{
	searched(referenceAttributes),
	searched("  - {name: a, type: timestamp, from: \"$.input['a-b'][2]\"}\n  - &x {name: b, type: number, from: input}\n  - *x\n"),
	searched("  - {name: and, type: bool, from: input..a}\n  - [a]\n  - {name: 9, type: 1, from: 2, extra: 3}\n"),
}

// checkSearchAttributes asserts what the search attributes of every valid
// definition hold.
func checkSearchAttributes(t *testing.T, attrs []definition.SearchAttribute) {
	require.LessOrEqual(t, len(attrs), definition.MaxSearchAttributes)
	seen := map[string]bool{}
	for _, a := range attrs {
		require.False(t, seen[a.Name], "attribute %s twice", a.Name)
		seen[a.Name] = true
		require.Contains(t, []definition.AttributeType{definition.AttributeString, definition.AttributeNumber, definition.AttributeTimestamp}, a.Type)
		require.NotContains(t, definition.BuiltInFields, strings.ToLower(a.Name))
		require.True(t, a.From.Singular(), "attribute %s from %s", a.Name, a.From)
		_, _, err := a.From.Lookup(map[string]any{})
		require.NoError(t, err)
	}
}
