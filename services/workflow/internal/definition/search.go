package definition

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

// MaxSearchAttributes bounds a workflow's search attributes: each is a row
// per run and an index entry, so they are for the few fields runs are looked
// up by.
const MaxSearchAttributes = 32

// AttributeType is the type of a search attribute's values.
type AttributeType string

// The attribute types.
const (
	AttributeString AttributeType = "string"
	AttributeNumber AttributeType = "number"
	// AttributeTimestamp values are written in inputs as epoch
	// milliseconds or RFC 3339 text.
	AttributeTimestamp AttributeType = "timestamp"
)

var attributeTypes = []string{string(AttributeString), string(AttributeNumber), string(AttributeTimestamp)}

// BuiltInFields are what run queries filter on besides search attributes;
// no attribute may take one of these names.
var BuiltInFields = []string{"workflow", "status", "started_at", "finished_at"}

// queryKeywords are the words of the run query language; an attribute
// named like one could not be written in a query.
var queryKeywords = []string{"and", "or", "in"}

// SearchAttribute is a queryable field a run takes from its input when it
// starts.
type SearchAttribute struct {
	Name string
	Type AttributeType
	// From is the path into the input, a singular $.input path.
	From *mapping.Path
	Pos  Position
}

// AttributeValue is one search attribute of one run. Str, Num or Time holds
// the value, as Type says.
type AttributeValue struct {
	Name string
	Type AttributeType
	Str  string
	Num  float64
	Time time.Time
}

// Convert reads v, a JSON value as mapping.DecodeJSON decodes it, as a value
// of type t: a string for string, a finite number for number, epoch
// milliseconds or RFC 3339 text for timestamp. The error says what v is
// instead.
func (t AttributeType) Convert(v any) (AttributeValue, error) {
	out := AttributeValue{Type: t}
	switch t {
	case AttributeString:
		if s, ok := v.(string); ok {
			out.Str = s
			return out, nil
		}
	case AttributeNumber:
		if n, ok := finite(v); ok {
			out.Num = n
			return out, nil
		}
	case AttributeTimestamp:
		if n, ok := finite(v); ok && math.Abs(n) <= maxEpochMillis {
			out.Time = time.UnixMilli(int64(n)).UTC()
			return out, nil
		}
		if s, ok := v.(string); ok {
			if ts, err := time.Parse(time.RFC3339Nano, s); err == nil {
				out.Time = ts.UTC()
				return out, nil
			}
			return out, fmt.Errorf("%s is not an RFC 3339 timestamp (2026-01-31T12:00:00Z) or epoch milliseconds", clipValue(s))
		}
	}
	return out, fmt.Errorf("%s is not a %s", describeJSON(v), t)
}

// maxEpochMillis keeps timestamps within what Postgres and time.Time hold
// (year 294276 is Postgres's end; this is about year 275760).
const maxEpochMillis = 8.64e15

// finite reads a JSON number as a finite float64.
func finite(v any) (float64, bool) {
	var n float64
	switch x := v.(type) {
	case int64:
		n = float64(x)
	case float64:
		n = x
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			return 0, false
		}
		n = f
	default:
		return 0, false
	}
	return n, !math.IsNaN(n) && !math.IsInf(n, 0)
}

// describeJSON names a decoded JSON value for messages.
func describeJSON(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return "the string " + clipValue(x)
	case bool:
		return "the boolean " + strconv.FormatBool(x)
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	if n, ok := finite(v); ok {
		return "the number " + strconv.FormatFloat(n, 'g', -1, 64)
	}
	return "a number out of range"
}

func clipValue(s string) string { return strconv.Quote(clip(s)) }

// SearchValues extracts the definition's search attributes from a run's
// input. An attribute whose path finds nothing (or null) is absent; a value
// of the wrong type is an Invalid error naming the attribute.
func (d *Definition) SearchValues(input json.RawMessage) ([]AttributeValue, error) {
	if len(d.SearchAttributes) == 0 {
		return nil, nil
	}
	doc, err := mapping.DecodeJSON(input)
	if err != nil {
		return nil, fault.Invalidf("input is not valid JSON: %v", err)
	}
	var out []AttributeValue
	for _, a := range d.SearchAttributes {
		v, found, err := a.From.Lookup(doc)
		if err != nil {
			return nil, fault.Invalidf("search attribute %s: %v", a.Name, err)
		}
		if !found || v == nil {
			continue
		}
		val, err := a.Type.Convert(v)
		if err != nil {
			return nil, fault.Invalidf("search attribute %s (%s, from %s): %v", a.Name, a.Type, a.From, err)
		}
		val.Name = a.Name
		out = append(out, val)
	}
	return out, nil
}

// reservedAttributeName reports whether name is a built-in field or a query
// keyword, in any case.
func reservedAttributeName(name string) bool {
	lower := strings.ToLower(name)
	return contains(BuiltInFields, lower) || contains(queryKeywords, lower)
}
