package query

import (
	"slices"
	"strings"

	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
)

// The built-in fields, as definition.BuiltInFields names them.
const (
	FieldWorkflow   = "workflow"
	FieldStatus     = "status"
	FieldStartedAt  = "started_at"
	FieldFinishedAt = "finished_at"
)

// builtIns gives each built-in field its type.
var builtIns = map[string]definition.AttributeType{
	FieldWorkflow:   definition.AttributeString,
	FieldStatus:     definition.AttributeString,
	FieldStartedAt:  definition.AttributeTimestamp,
	FieldFinishedAt: definition.AttributeTimestamp,
}

var statuses = []string{
	string(engine.StatusPending), string(engine.StatusRunning), string(engine.StatusWaiting), string(engine.StatusCompleted),
	string(engine.StatusFailed), string(engine.StatusCancelled), string(engine.StatusTimedOut),
}

// Declared maps each search attribute the workflows in a query's scope
// declare to the types they declare it with (versions may differ).
type Declared map[string][]definition.AttributeType

// Cond is a checked comparison: a built-in field or an attribute, with its
// literals converted to the field's type.
type Cond struct {
	// BuiltIn is the built-in field compared; empty for an attribute.
	BuiltIn string
	// Attribute is the search attribute compared; empty for a built-in.
	Attribute string
	Op        Op
	// Typed holds the literals converted to each type the field has that
	// takes them all: one for a built-in, one or more for an attribute
	// declared with several types. A run matches when it matches any.
	Typed []Typed
	At    int
}

// Pos implements Expr.
func (c *Cond) Pos() int { return c.At }

// Typed is a comparison's literals as values of one type.
type Typed struct {
	Type   definition.AttributeType
	Values []definition.AttributeValue
}

// Check resolves a parsed query: every comparison becomes a *Cond, joined
// by the same *Bool nodes. An attribute that declared does not hold, or a
// literal no type of its field takes, is an *Error at its position.
func Check(e Expr, declared Declared) (Expr, error) {
	switch x := e.(type) {
	case *Bool:
		left, err := Check(x.Left, declared)
		if err != nil {
			return nil, err
		}
		right, err := Check(x.Right, declared)
		if err != nil {
			return nil, err
		}
		return &Bool{Or: x.Or, Left: left, Right: right}, nil
	case *Comparison:
		return check(x, declared)
	}
	return e, nil
}

func check(c *Comparison, declared Declared) (*Cond, error) {
	out := &Cond{Op: c.Op, At: c.At}
	var types []definition.AttributeType
	if t, ok := builtIns[strings.ToLower(c.Field)]; ok {
		out.BuiltIn = strings.ToLower(c.Field)
		types = []definition.AttributeType{t}
	} else {
		types, ok = declared[c.Field]
		if !ok {
			return nil, errorf(c.At, "unknown attribute %q: no workflow in scope declares it%s; the built-in fields are %s",
				clip(c.Field), suggest(c.Field, declared), strings.Join(definition.BuiltInFields, ", "))
		}
		out.Attribute = c.Field
	}
	var firstErr *Error
	for _, t := range types {
		typed := Typed{Type: t}
		for _, lit := range c.Values {
			v, err := convert(out.BuiltIn, t, lit)
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				typed.Values = nil
				break
			}
			typed.Values = append(typed.Values, v)
		}
		if typed.Values != nil {
			out.Typed = append(out.Typed, typed)
		}
	}
	if len(out.Typed) == 0 {
		if len(types) > 1 {
			firstErr.Message = "type mismatch: " + c.Field + " is declared as " + joinTypes(types) + "; " + strings.TrimPrefix(firstErr.Message, "type mismatch: ")
		}
		return nil, firstErr
	}
	return out, nil
}

// convert reads a literal as a value of t. A timestamp is written as RFC
// 3339 text or epoch milliseconds, as in run inputs.
func convert(builtIn string, t definition.AttributeType, lit Literal) (definition.AttributeValue, *Error) {
	v, err := t.Convert(lit.Value)
	if err != nil {
		return v, errorf(lit.At, "type mismatch: %s", err)
	}
	if builtIn == FieldStatus && !slices.Contains(statuses, v.Str) {
		return v, errorf(lit.At, "status %q is not one of %s", clip(v.Str), strings.Join(statuses, ", "))
	}
	return v, nil
}

func joinTypes(ts []definition.AttributeType) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, " or ")
}

// suggest names the declared attribute closest to name, ignoring case and
// '_' and '-', when there is one.
func suggest(name string, declared Declared) string {
	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer("_", "", "-", "", ".", "").Replace(s))
	}
	for d := range declared {
		if norm(d) == norm(name) {
			return " (did you mean " + d + "?)"
		}
	}
	return ""
}

// Workflows returns the workflows a parsed query restricts its runs to
// (workflow = "x", workflow IN (…), through AND and OR), and false when it
// lets runs of any workflow through. Attributes are checked against what
// those workflows declare.
func Workflows(e Expr) ([]string, bool) {
	switch x := e.(type) {
	case *Bool:
		l, lok := Workflows(x.Left)
		r, rok := Workflows(x.Right)
		switch {
		case x.Or && lok && rok:
			return union(l, r), true
		case x.Or:
			return nil, false
		case lok && rok:
			return intersect(l, r), true
		case lok:
			return l, true
		case rok:
			return r, true
		}
	case *Comparison:
		if strings.ToLower(x.Field) != FieldWorkflow || (x.Op != OpEq && x.Op != OpIn) {
			return nil, false
		}
		var names []string
		for _, v := range x.Values {
			if s, ok := v.Value.(string); ok {
				names = append(names, s)
			}
		}
		return names, true
	}
	return nil, false
}

func union(a, b []string) []string {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

func intersect(a, b []string) []string {
	out := []string{}
	for _, s := range a {
		if slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}
