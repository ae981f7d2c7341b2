// Package mapping builds a workflow step's input from its inputMapping: a JSON
// template whose string values starting with "$." are paths into the run —
// its input, the outputs and outcomes of steps that already ran, and facts of
// the run itself — and whose other values pass through unchanged.
//
// The path forms are those of the workflow language:
//
//	$.input                          the run's input
//	$.input.a.b[0]                   a value inside the input
//	$.steps.NAME.output              the output of step NAME
//	$.steps.NAME.output.field        a value inside that output
//	$.steps.NAME.outcome             the outcome string of step NAME
//	$.flo.run_id                     the run's id
//	$.flo.timestamp                  the current time in epoch milliseconds
//
// The start step is addressed as _start. After $.input and .output the rest
// of the path is JSONPath (RFC 9535 style, evaluated by ohler55/ojg), so
// wildcards, slices and filters work too; names that are not plain
// identifiers use brackets: $.input['order-id']. A path that can select at
// most one value (only names and indexes) must find it; one that can select
// several resolves to the array of what it found, possibly empty.
package mapping

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/ohler55/ojg/jp"
)

// StartStep is the name by which paths address the start step.
const StartStep = "_start"

// Root says which part of the run a path reads.
type Root int

// The roots a path can start from.
const (
	RootInput Root = iota + 1
	RootStepOutput
	RootStepOutcome
	RootRunID
	RootTimestamp
)

func (r Root) String() string {
	switch r {
	case RootInput:
		return "input"
	case RootStepOutput:
		return "step output"
	case RootStepOutcome:
		return "step outcome"
	case RootRunID:
		return "run id"
	case RootTimestamp:
		return "timestamp"
	}
	return fmt.Sprintf("Root(%d)", int(r))
}

// Path is a parsed path reference.
type Path struct {
	raw  string
	root Root
	step string
	// rest is the JSONPath applied below $.input or .output, rooted at "$";
	// nil when the path stops at its root.
	rest     jp.Expr
	singular bool
}

// stepNamePattern is what a step name may look like: no dots or brackets, so
// $.steps.NAME.output splits unambiguously.
var stepNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// IsStepName reports whether s can name a step in a path. Workflow
// definitions hold step names to this rule so every step is addressable.
func IsStepName(s string) bool { return stepNamePattern.MatchString(s) }

// forms lists the supported forms for error messages.
const forms = "$.input…, $.steps.NAME.output…, $.steps.NAME.outcome, $.flo.run_id or $.flo.timestamp"

// IsPath reports whether a template string is a path reference rather than a
// literal: it starts with "$.".
func IsPath(s string) bool { return strings.HasPrefix(s, "$.") }

// ParsePath parses one path reference.
func ParsePath(s string) (*Path, error) {
	// Only a JSONPath below the root can select several values.
	p := &Path{raw: s, singular: true}
	if !IsPath(s) {
		return nil, &SyntaxError{Path: s, Problem: "must start with $."}
	}
	body := s[2:]
	switch {
	case body == "flo.run_id":
		p.root = RootRunID
		return p, nil
	case body == "flo.timestamp":
		p.root = RootTimestamp
		return p, nil
	case body == "flo" || strings.HasPrefix(body, "flo.") || strings.HasPrefix(body, "flo["):
		return nil, &SyntaxError{Path: s, Problem: "$.flo has only run_id and timestamp"}
	case hasSegment(body, "input"):
		p.root = RootInput
		return p, p.parseRest(body[len("input"):])
	case hasSegment(body, "steps"):
		return p, p.parseStep(body[len("steps"):])
	}
	return nil, &SyntaxError{Path: s, Problem: "must be one of " + forms}
}

// hasSegment reports whether body starts with the name as a whole segment.
func hasSegment(body, name string) bool {
	if !strings.HasPrefix(body, name) {
		return false
	}
	rest := body[len(name):]
	return rest == "" || rest[0] == '.' || rest[0] == '['
}

func (p *Path) parseStep(after string) error {
	if !strings.HasPrefix(after, ".") {
		return &SyntaxError{Path: p.raw, Problem: "must name a step: $.steps.NAME.output or $.steps.NAME.outcome"}
	}
	name, field, _ := strings.Cut(after[1:], ".")
	if !IsStepName(name) {
		return &SyntaxError{Path: p.raw, Problem: fmt.Sprintf("%q is not a step name", name)}
	}
	p.step = name
	switch {
	case field == "outcome":
		p.root = RootStepOutcome
		return nil
	case hasSegment(field, "output"):
		p.root = RootStepOutput
		return p.parseRest(field[len("output"):])
	}
	return &SyntaxError{Path: p.raw, Problem: fmt.Sprintf("a step path continues with .output or .outcome, not %q", field)}
}

func (p *Path) parseRest(rest string) error {
	if rest == "" {
		return nil
	}
	x, err := jp.ParseString("$" + rest)
	if err != nil {
		return &SyntaxError{Path: p.raw, Problem: fmt.Sprintf("invalid JSONPath %q: %v", rest, err)}
	}
	p.rest = x
	p.singular = singular(x)
	return nil
}

// singular reports whether x selects at most one value: it holds only names
// and indexes.
func singular(x jp.Expr) bool {
	for _, f := range x {
		switch f.(type) {
		case jp.Root, jp.Child, jp.Nth, jp.Bracket:
		default:
			return false
		}
	}
	return true
}

// String returns the path as written.
func (p *Path) String() string { return p.raw }

// Root returns what part of the run the path reads.
func (p *Path) Root() Root { return p.root }

// Step returns the step a $.steps path names, or "".
func (p *Path) Step() string { return p.step }

// Singular reports whether the path selects at most one value; a singular path
// that finds nothing is an error, a non-singular one resolves to an array.
func (p *Path) Singular() bool { return p.singular }

// SyntaxError is a path that cannot be parsed.
type SyntaxError struct {
	Path    string
	Problem string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("path %q: %s", e.Path, e.Problem) }
