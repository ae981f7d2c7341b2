package mapping

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
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
	// MaxBytes bounds the resolved input: the service's payload limit, since
	// a larger input could not be sent anyway. Zero means DefaultMaxBytes.
	MaxBytes int
}

// DefaultMaxBytes is the bound on a resolved input when Context.MaxBytes is
// zero: the platform's default payload limit.
const DefaultMaxBytes = 1 << 20

// ResolveError is a path that could not be resolved for a step.
type ResolveError struct {
	Step    string
	Path    string
	Problem string
}

func (e *ResolveError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("step %q: inputMapping %s", e.Step, e.Problem)
	}
	return fmt.Sprintf("step %q: inputMapping path %q: %s", e.Step, e.Path, e.Problem)
}

// resolver holds the documents decoded for one Resolve call, so each is
// decoded at most once however many paths read it, and the input built so
// far, which never grows past max bytes.
type resolver struct {
	c       *Context
	input   any
	inputOK bool
	outputs map[string]any
	buf     bytes.Buffer
	max     int
}

// Resolve builds the step input: the template with every path replaced by
// the value it selects. It never panics on bad input; anything it cannot
// resolve is a *ResolveError naming the step and the path. An input that
// would grow past c.MaxBytes is such an error too, found while it is being
// built: a small template repeating a path, or a path selecting a value many
// times over, cannot make it allocate more than about the bound.
func (t *Template) Resolve(c *Context) (json.RawMessage, error) {
	r := &resolver{c: c, outputs: map[string]any{}, max: c.MaxBytes}
	if r.max <= 0 {
		r.max = DefaultMaxBytes
	}
	if err := r.write(t.root); err != nil {
		return nil, err
	}
	return r.buf.Bytes(), nil
}

// emit appends b to the input unless that takes it past the bound; p is the
// path being written, nil for the template's own text.
func (r *resolver) emit(p *Path, b ...byte) error {
	if r.buf.Len()+len(b) > r.max {
		return r.tooLarge(p)
	}
	r.buf.Write(b)
	return nil
}

func (r *resolver) tooLarge(p *Path) error {
	problem := fmt.Sprintf("resolves to more than %d bytes, the payload limit", r.max)
	if p == nil {
		return &ResolveError{Step: r.c.Step, Problem: problem}
	}
	return r.fail(p, "makes the input grow past the payload limit of "+strconv.Itoa(r.max)+" bytes")
}

// write appends node n.
func (r *resolver) write(n node) error {
	switch {
	case n.path != nil:
		v, err := r.resolve(n.path)
		if err != nil {
			return err
		}
		if many, ok := v.(selected); ok {
			return r.writeMany(n.path, many)
		}
		return r.writeValue(n.path, v)
	case n.isObj:
		if err := r.emit(nil, '{'); err != nil {
			return err
		}
		for i, m := range n.object {
			if i > 0 {
				if err := r.emit(nil, ','); err != nil {
					return err
				}
			}
			k, _ := encode(m.key)
			if err := r.emit(nil, append(k, ':')...); err != nil {
				return err
			}
			if err := r.write(m.value); err != nil {
				return err
			}
		}
		return r.emit(nil, '}')
	case n.isArr:
		if err := r.emit(nil, '['); err != nil {
			return err
		}
		for i, e := range n.array {
			if i > 0 {
				if err := r.emit(nil, ','); err != nil {
					return err
				}
			}
			if err := r.write(e); err != nil {
				return err
			}
		}
		return r.emit(nil, ']')
	}
	return r.emit(nil, n.literal...)
}

// writeValue appends one selected value. It is a part of one document read
// by the template, so encoding it whole costs at most about that document.
func (r *resolver) writeValue(p *Path, v any) error {
	b, err := encode(v)
	if err != nil {
		return r.fail(p, "selects a value that cannot be encoded as JSON: "+err.Error())
	}
	return r.emit(p, b...)
}

// writeMany appends what a non-singular path selected as an array, one value
// at a time, so the bound holds however many times a value was selected.
func (r *resolver) writeMany(p *Path, vs selected) error {
	if err := r.emit(p, '['); err != nil {
		return err
	}
	for i, v := range vs {
		if i > 0 {
			if err := r.emit(p, ','); err != nil {
				return err
			}
		}
		if err := r.writeValue(p, v); err != nil {
			return err
		}
	}
	return r.emit(p, ']')
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
		// Each value in the array takes at least two bytes (itself and a
		// comma), so more than that many cannot fit. Locate counts them
		// and stops there before Get builds the list: unions and ".."
		// select a value once per way to reach it, so a short path can
		// select a small document's values billions of times.
		most := (r.max-r.buf.Len())/2 + 1
		if len(p.rest.Locate(doc, most+1)) > most {
			return nil, r.tooLarge(p)
		}
		return selected(p.rest.Get(doc)), nil
	}
	v, ok := p.rest.FirstFound(doc)
	if !ok {
		return nil, r.fail(p, fmt.Sprintf("%s has no value at %s", what, describe(p.rest)))
	}
	return v, nil
}

// selected is what a non-singular path found, written as a JSON array.
type selected []any

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
