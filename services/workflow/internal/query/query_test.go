package query_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/query"
)

// render prints a parsed query with every AND and OR in parentheses, so
// tests see how it grouped.
func render(e query.Expr) string {
	switch x := e.(type) {
	case *query.Bool:
		op := "AND"
		if x.Or {
			op = "OR"
		}
		return "(" + render(x.Left) + " " + op + " " + render(x.Right) + ")"
	case *query.Comparison:
		vals := make([]string, len(x.Values))
		for i, v := range x.Values {
			if s, ok := v.Value.(string); ok {
				vals[i] = strconv.Quote(s)
			} else {
				vals[i] = fmt.Sprint(v.Value)
			}
		}
		if x.Op == query.OpIn {
			return x.Field + " IN [" + strings.Join(vals, " ") + "]"
		}
		return x.Field + " " + string(x.Op) + " " + vals[0]
	}
	return "?"
}

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src, want string
	}{
		{name: "equal", src: `customer_id = "c-42"`, want: `customer_id = "c-42"`},
		{name: "not equal", src: `a != "x"`, want: `a != "x"`},
		{name: "not equal, SQL spelling", src: `a <> 1`, want: `a != 1`},
		{name: "less", src: `a < 1`, want: `a < 1`},
		{name: "less or equal", src: `a <= -1.5`, want: `a <= -1.5`},
		{name: "greater", src: `a>1e3`, want: `a > 1000`},
		{name: "greater or equal", src: `a >= .5`, want: `a >= 0.5`},
		{name: "in", src: `status IN ("failed", "timed_out")`, want: `status IN ["failed" "timed_out"]`},
		{name: "in with one value, lower case", src: `a in (1)`, want: `a IN [1]`},
		{name: "single quotes", src: `a = 'it'`, want: `a = "it"`},
		{name: "escapes in double quotes", src: `a = "say \"hi\"\n"`, want: `a = "say \"hi\"\n"`},
		{name: "names with dots and dashes", src: `order.total-eur > 5`, want: `order.total-eur > 5`},
		{name: "and", src: `a = 1 AND b = 2`, want: `(a = 1 AND b = 2)`},
		{name: "or", src: `a = 1 or b = 2`, want: `(a = 1 OR b = 2)`},
		{name: "AND binds tighter than OR", src: `a = 1 OR b = 2 AND c = 3`, want: `(a = 1 OR (b = 2 AND c = 3))`},
		{name: "AND binds tighter on the left too", src: `a = 1 AND b = 2 OR c = 3`, want: `((a = 1 AND b = 2) OR c = 3)`},
		{name: "parentheses group", src: `(a = 1 OR b = 2) AND c = 3`, want: `((a = 1 OR b = 2) AND c = 3)`},
		{name: "chains associate left", src: `a = 1 AND b = 2 AND c = 3`, want: `((a = 1 AND b = 2) AND c = 3)`},
		{name: "redundant parentheses", src: `((a = 1))`, want: `a = 1`},
		{name: "the issue's example", src: `customer_id = "c-42" AND order_amount > 100`, want: `(customer_id = "c-42" AND order_amount > 100)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := query.Parse(tc.src)
			require.NoError(t, err)
			require.Equal(t, tc.want, render(e))
		})
	}
}

func TestParseEmpty(t *testing.T) {
	t.Parallel()
	for _, src := range []string{"", "  \t\n"} {
		e, err := query.Parse(src)
		require.NoError(t, err)
		require.Nil(t, e)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		pos       int
		contains  string
	}{
		{name: "no operator", src: `a "x"`, pos: 3, contains: `expected an operator (=, !=, <, <=, >, >=, IN) after a, found the string "x"`},
		{name: "no value", src: `a =`, pos: 4, contains: "expected a value"},
		{name: "a name as the value", src: `a = b`, pos: 5, contains: `expected a value (a "string" or a number), found "b"`},
		{name: "unclosed string", src: `a = "x`, pos: 5, contains: "string is not closed"},
		{name: "bad escape", src: `a = "\q"`, pos: 5, contains: "bad escape"},
		{name: "unclosed parenthesis", src: `(a = 1`, pos: 7, contains: "expected ) to close the ( at 1, found the end of the query"},
		{name: "stray closing parenthesis", src: `a = 1)`, pos: 6, contains: "expected AND, OR or the end of the query"},
		{name: "dangling AND", src: `a = 1 AND`, pos: 10, contains: "expected a field name or ("},
		{name: "two comparisons without AND", src: `a = 1 b = 2`, pos: 7, contains: "expected AND, OR"},
		{name: "IN without parentheses", src: `a IN "x"`, pos: 6, contains: "expected ( after IN"},
		{name: "IN list without a comma", src: `a IN ("x" "y")`, pos: 11, contains: "expected , or ) in the IN list"},
		{name: "empty IN list", src: `a IN ()`, pos: 7, contains: "expected a value"},
		{name: "unknown character", src: `a = 1 && b = 2`, pos: 7, contains: "unexpected character '&'"},
		{name: "not a number", src: `a = 1.2.3`, pos: 5, contains: `"1.2.3" is not a number`},
		{name: "infinity is not a number", src: `a = -inf`, pos: 5, contains: "is not a number"},
		{name: "a keyword as a field", src: `AND = 1`, pos: 1, contains: "expected a field name or (, found AND"},
		{name: "too deep", src: strings.Repeat("(", 40) + "a = 1" + strings.Repeat(")", 40), pos: 33, contains: "nest more than 32 deep"},
		{name: "too long", src: "a = \"" + strings.Repeat("x", query.MaxBytes) + "\"", pos: 1, contains: "the limit is 4096"},
		{name: "too many comparisons", src: strings.Repeat("a = 1 OR ", query.MaxComparisons) + "a = 1", pos: 9*query.MaxComparisons + 1, contains: "more than 64 comparisons"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := query.Parse(tc.src)
			var qe *query.Error
			require.ErrorAs(t, err, &qe)
			require.Equal(t, tc.pos, qe.Pos, "%v", err)
			require.Contains(t, qe.Message, tc.contains)
			require.Contains(t, err.Error(), fmt.Sprintf("where: at %d: ", tc.pos))
			var f *fault.Error
			require.True(t, errors.As(err, &f) && f.Kind == fault.Invalid)
		})
	}
}

var declared = query.Declared{
	"customer_id":  {definition.AttributeString},
	"order_amount": {definition.AttributeNumber},
	"created":      {definition.AttributeTimestamp},
	"code":         {definition.AttributeString, definition.AttributeNumber},
	"stamp":        {definition.AttributeNumber, definition.AttributeTimestamp},
}

func TestCheck(t *testing.T) {
	t.Parallel()
	when := time.Date(2026, 1, 31, 12, 0, 0, 0, time.UTC)
	e, err := query.Parse(`customer_id IN ("a", "b") AND (order_amount >= 10 OR created < "2026-01-31T12:00:00Z") ` +
		`AND STATUS = "failed" AND started_at > 1769860800000 AND code = 7`)
	require.NoError(t, err)
	checked, err := query.Check(e, declared)
	require.NoError(t, err)
	var conds []*query.Cond
	var walk func(query.Expr)
	walk = func(e query.Expr) {
		switch x := e.(type) {
		case *query.Bool:
			walk(x.Left)
			walk(x.Right)
		case *query.Cond:
			conds = append(conds, x)
		}
	}
	walk(checked)
	require.Len(t, conds, 6)
	require.Equal(t, "customer_id", conds[0].Attribute)
	require.Equal(t, []query.Typed{{Type: definition.AttributeString, Values: []definition.AttributeValue{
		{Type: definition.AttributeString, Str: "a"}, {Type: definition.AttributeString, Str: "b"},
	}}}, conds[0].Typed)
	require.Equal(t, 10.0, conds[1].Typed[0].Values[0].Num)
	require.Equal(t, when, conds[2].Typed[0].Values[0].Time)
	require.Equal(t, query.FieldStatus, conds[3].BuiltIn)
	require.Equal(t, when, conds[4].Typed[0].Values[0].Time, "epoch milliseconds for a timestamp")
	require.Equal(t, []query.Typed{{Type: definition.AttributeNumber, Values: []definition.AttributeValue{{Type: definition.AttributeNumber, Num: 7}}}},
		conds[5].Typed, "an attribute declared with two types compares as those that take the literal")
}

func TestCheckErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		pos       int
		contains  string
	}{
		{name: "unknown attribute", src: `order_amount > 1 AND customer = "x"`, pos: 22, contains: `unknown attribute "customer": no workflow in scope declares it`},
		{name: "unknown attribute close to one", src: `Customer-ID = "x"`, pos: 1, contains: "did you mean customer_id?"},
		{name: "number for a string attribute", src: `customer_id = 42`, pos: 15, contains: "type mismatch: the number 42 is not a string"},
		{name: "string for a number attribute", src: `order_amount > "100"`, pos: 16, contains: `type mismatch: the string "100" is not a number`},
		{name: "one bad value in a list", src: `customer_id IN ("a", 2)`, pos: 22, contains: "is not a string"},
		{name: "text that is not a timestamp", src: `created > "monday"`, pos: 11, contains: `"monday" is not an RFC 3339 timestamp`},
		{name: "number for the workflow", src: `workflow = 1`, pos: 12, contains: "is not a string"},
		{name: "unknown status", src: `status = "done"`, pos: 10, contains: `status "done" is not one of pending, running, waiting, completed, failed, cancelled, timed_out`},
		{name: "a value neither type takes", src: `stamp = "monday"`, pos: 9, contains: `type mismatch: stamp is declared as number or timestamp; the string "monday" is not a number`},
		{name: "mismatch for an attribute of two types", src: `code < "x" AND created = "2026-01-01"`, pos: 26, contains: "not an RFC 3339"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := query.Parse(tc.src)
			require.NoError(t, err)
			_, err = query.Check(e, declared)
			var qe *query.Error
			require.ErrorAs(t, err, &qe)
			require.Equal(t, tc.pos, qe.Pos, "%v", err)
			require.Contains(t, qe.Message, tc.contains)
		})
	}
}

func TestWorkflows(t *testing.T) {
	t.Parallel()
	tests := []struct {
		src        string
		want       []string
		restricted bool
	}{
		{src: `a = 1`},
		{src: `workflow = "w"`, want: []string{"w"}, restricted: true},
		{src: `workflow != "w"`},
		{src: `workflow IN ("w", "v") AND a = 1`, want: []string{"w", "v"}, restricted: true},
		{src: `a = 1 AND workflow = "w"`, want: []string{"w"}, restricted: true},
		{src: `workflow = "w" OR a = 1`},
		{src: `workflow = "w" OR workflow = "v"`, want: []string{"v", "w"}, restricted: true},
		{src: `workflow IN ("w", "v") AND workflow = "v"`, want: []string{"v"}, restricted: true},
	}
	for _, tc := range tests {
		e, err := query.Parse(tc.src)
		require.NoError(t, err)
		got, restricted := query.Workflows(e)
		require.Equal(t, tc.restricted, restricted, tc.src)
		require.Equal(t, tc.want, got, tc.src)
	}
}

// FuzzParse: any text parses or is refused with an *Error at a position
// inside it (or just past its end), and a parsed query checks without
// panicking.
func FuzzParse(f *testing.F) {
	for _, src := range []string{
		`customer_id = "c-42" AND order_amount > 100`,
		`(a = 1 OR b IN ("x", 'y', 3)) and c <> -1e3`,
		`created >= "2026-01-31T12:00:00Z" OR status = "failed" AND workflow IN ("w")`,
		`a = "\u00e9\n"`, `((`, `a IN (`, `"`, `a = 1 OR`,
	} {
		f.Add(src)
	}
	f.Fuzz(func(t *testing.T, src string) {
		e, err := query.Parse(src)
		if err != nil {
			var qe *query.Error
			require.ErrorAs(t, err, &qe)
			require.True(t, qe.Pos >= 1 && qe.Pos <= len(src)+1, "position %d in %d bytes", qe.Pos, len(src))
			return
		}
		if e == nil {
			require.Empty(t, strings.TrimSpace(src))
			return
		}
		query.Workflows(e)
		if _, err := query.Check(e, declared); err != nil {
			var qe *query.Error
			require.ErrorAs(t, err, &qe)
		}
	})
}
