package mapping

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ohler55/ojg/jp"
	"github.com/ohler55/ojg/oj"
)

// MaxDepth bounds how deeply a template may nest objects and arrays.
const MaxDepth = 64

// Template is a compiled inputMapping.
type Template struct {
	src   string
	root  node
	paths []*Path
}

// node is one value of the template: exactly one field is set.
type node struct {
	literal json.RawMessage // any JSON value that is not an object, array or path
	path    *Path
	object  []member
	array   []node
	isObj   bool
	isArr   bool
}

type member struct {
	key   string
	value node
}

// Compile parses an inputMapping: JSON text whose strings starting with "$."
// are paths. Usually an object, but any JSON value is allowed.
func Compile(src string) (*Template, error) {
	dec := json.NewDecoder(strings.NewReader(src))
	dec.UseNumber()
	t := &Template{src: src}
	root, err := t.parse(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, &SyntaxError{Path: src, Problem: "inputMapping must hold a single JSON value"}
	}
	t.root = root
	return t, nil
}

func (t *Template) parse(dec *json.Decoder, depth int) (node, error) {
	if depth > MaxDepth {
		return node{}, &TemplateError{Problem: fmt.Sprintf("nests deeper than %d levels", MaxDepth)}
	}
	tok, err := dec.Token()
	if err != nil {
		return node{}, &TemplateError{Problem: "is not valid JSON: " + jsonProblem(err)}
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			n := node{isObj: true}
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return node{}, &TemplateError{Problem: "is not valid JSON: " + jsonProblem(err)}
				}
				key, _ := kt.(string)
				if seen[key] {
					return node{}, &TemplateError{Problem: fmt.Sprintf("has the key %q twice", key)}
				}
				seen[key] = true
				val, err := t.parse(dec, depth+1)
				if err != nil {
					return node{}, err
				}
				n.object = append(n.object, member{key: key, value: val})
			}
			if _, err := dec.Token(); err != nil {
				return node{}, &TemplateError{Problem: "is not valid JSON: " + jsonProblem(err)}
			}
			return n, nil
		case '[':
			n := node{isArr: true}
			for dec.More() {
				val, err := t.parse(dec, depth+1)
				if err != nil {
					return node{}, err
				}
				n.array = append(n.array, val)
			}
			if _, err := dec.Token(); err != nil {
				return node{}, &TemplateError{Problem: "is not valid JSON: " + jsonProblem(err)}
			}
			return n, nil
		}
		return node{}, &TemplateError{Problem: fmt.Sprintf("is not valid JSON: unexpected %q", v)}
	case string:
		if IsPath(v) {
			p, err := ParsePath(v)
			if err != nil {
				return node{}, err
			}
			t.paths = append(t.paths, p)
			return node{path: p}, nil
		}
	}
	raw, err := encode(tok)
	if err != nil {
		return node{}, &TemplateError{Problem: "holds a value that cannot be encoded: " + err.Error()}
	}
	return node{literal: raw}, nil
}

func jsonProblem(err error) string {
	if errors.Is(err, io.EOF) {
		return "unexpected end"
	}
	return err.Error()
}

// String returns the template as written.
func (t *Template) String() string { return t.src }

// Paths returns every path reference in the template, in order of appearance.
func (t *Template) Paths() []*Path { return t.paths }

// TemplateError is an inputMapping that is not a usable JSON template.
type TemplateError struct {
	Problem string
}

func (e *TemplateError) Error() string { return "inputMapping " + e.Problem }

// StepResult is what a finished step left for later steps.
type StepResult struct {
	Outcome string
	// Output is the step's JSON output; empty means null.
	Output json.RawMessage
}

// Context is what a template resolves against.
type Context struct {
	// Step is the step whose input is being built; errors name it.
	Step  string
	RunID string
	// Now is the time $.flo.timestamp reads.
	Now time.Time
	// Input is the run's JSON input; empty means null.
	Input json.RawMessage
	// Steps holds the steps that ran so far by name; the start step is
	// StartStep.
	Steps map[string]StepResult
}

// ResolveError is a path that could not be resolved for a step.
type ResolveError struct {
	Step    string
	Path    string
	Problem string
}

func (e *ResolveError) Error() string {
	return fmt.Sprintf("step %q: inputMapping path %q: %s", e.Step, e.Path, e.Problem)
}

// resolver holds the documents decoded for one Resolve call, so each is
// decoded at most once however many paths read it.
type resolver struct {
	c       *Context
	input   any
	inputOK bool
	outputs map[string]any
}

// Resolve builds the step input: the template with every path replaced by
// the value it selects. It never panics on bad input; anything it cannot
// resolve is a *ResolveError naming the step and the path.
func (t *Template) Resolve(c *Context) (json.RawMessage, error) {
	r := &resolver{c: c, outputs: map[string]any{}}
	var buf bytes.Buffer
	if err := r.write(&buf, t.root); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (r *resolver) write(buf *bytes.Buffer, n node) error {
	switch {
	case n.path != nil:
		v, err := r.resolve(n.path)
		if err != nil {
			return err
		}
		b, err := encode(v)
		if err != nil {
			return r.fail(n.path, "selects a value that cannot be encoded as JSON: "+err.Error())
		}
		buf.Write(b)
	case n.isObj:
		buf.WriteByte('{')
		for i, m := range n.object {
			if i > 0 {
				buf.WriteByte(',')
			}
			k, _ := encode(m.key)
			buf.Write(k)
			buf.WriteByte(':')
			if err := r.write(buf, m.value); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case n.isArr:
		buf.WriteByte('[')
		for i, e := range n.array {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := r.write(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	default:
		buf.Write(n.literal)
	}
	return nil
}

func (r *resolver) fail(p *Path, problem string) error {
	return &ResolveError{Step: r.c.Step, Path: p.raw, Problem: problem}
}

func (r *resolver) resolve(p *Path) (any, error) {
	switch p.root {
	case RootRunID:
		return r.c.RunID, nil
	case RootTimestamp:
		return r.c.Now.UnixMilli(), nil
	case RootInput:
		if !r.inputOK {
			v, err := decode(r.c.Input)
			if err != nil {
				return nil, r.fail(p, "the run input is not valid JSON: "+err.Error())
			}
			r.input, r.inputOK = v, true
		}
		return r.selectIn(p, r.input, "the run input")
	case RootStepOutcome:
		res, ok := r.c.Steps[p.step]
		if !ok {
			return nil, r.fail(p, fmt.Sprintf("step %q has not run", p.step))
		}
		return res.Outcome, nil
	case RootStepOutput:
		doc, ok := r.outputs[p.step]
		if !ok {
			res, ran := r.c.Steps[p.step]
			if !ran {
				return nil, r.fail(p, fmt.Sprintf("step %q has not run", p.step))
			}
			v, err := decode(res.Output)
			if err != nil {
				return nil, r.fail(p, fmt.Sprintf("the output of step %q is not valid JSON: %v", p.step, err))
			}
			r.outputs[p.step], doc = v, v
		}
		return r.selectIn(p, doc, fmt.Sprintf("the output of step %q", p.step))
	}
	return nil, r.fail(p, "has no root")
}

// selectIn applies the path's JSONPath to doc. The JSONPath library is
// third-party code fed user data, so a panic in it becomes an error here
// rather than taking the engine down.
func (r *resolver) selectIn(p *Path, doc any, what string) (v any, err error) {
	if p.rest == nil {
		return doc, nil
	}
	defer func() {
		if rec := recover(); rec != nil {
			v, err = nil, r.fail(p, fmt.Sprintf("could not be evaluated: %v", rec))
		}
	}()
	if !p.singular {
		found := p.rest.Get(doc)
		if found == nil {
			found = []any{}
		}
		return found, nil
	}
	v, ok := p.rest.FirstFound(doc)
	if !ok {
		return nil, r.fail(p, fmt.Sprintf("%s has no value at %s", what, describe(p.rest)))
	}
	return v, nil
}

// describe prints a JSONPath below its root for messages: "$.a.b" becomes ".a.b".
func describe(x jp.Expr) string {
	return strings.TrimPrefix(x.String(), "$")
}

// decode parses JSON into the generic values the JSONPath library walks.
func decode(raw json.RawMessage) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	return oj.Parse(raw)
}

// encode writes v as compact JSON, leaving <, > and & as they are: the result
// is a step's input, not HTML.
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
