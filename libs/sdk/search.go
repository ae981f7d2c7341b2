package flo

import (
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// SearchAttribute is one search attribute of a run, taken from its input when it started as
// the workflow's searchAttributes section says. Type says which of String, Number and Time
// holds the value.
type SearchAttribute struct {
	Name string
	// Type is "string", "number" or "timestamp".
	Type   string
	String string
	Number float64
	Time   time.Time
}

// Value returns the attribute's value: a string, a float64 or a time.Time.
func (a SearchAttribute) Value() any {
	switch a.Type {
	case "number":
		return a.Number
	case "timestamp":
		return a.Time
	}
	return a.String
}

// SearchAttribute returns the run's attribute called name, and false when the run has none
// (its input lacked it, or the workflow declares no such attribute).
func (r *Run) SearchAttribute(name string) (SearchAttribute, bool) {
	for _, a := range r.SearchAttributes {
		if a.Name == name {
			return a, true
		}
	}
	return SearchAttribute{}, false
}

// searchAttributesJSON is how `flo workflow status` shows the attributes: name to value.
func searchAttributesJSON(attrs []SearchAttribute) map[string]any {
	if len(attrs) == 0 {
		return nil
	}
	out := make(map[string]any, len(attrs))
	for _, a := range attrs {
		out[a.Name] = a.Value()
	}
	return out
}

func searchAttributesFromProto(attrs []*flov1.SearchAttribute) []SearchAttribute {
	var out []SearchAttribute
	for _, a := range attrs {
		sa := SearchAttribute{Name: a.GetName()}
		switch v := a.GetValue().(type) {
		case *flov1.SearchAttribute_StringValue:
			sa.Type, sa.String = "string", v.StringValue
		case *flov1.SearchAttribute_NumberValue:
			sa.Type, sa.Number = "number", v.NumberValue
		case *flov1.SearchAttribute_TimestampValue:
			sa.Type, sa.Time = "timestamp", timeFromProto(v.TimestampValue)
		default:
			continue
		}
		out = append(out, sa)
	}
	return out
}
