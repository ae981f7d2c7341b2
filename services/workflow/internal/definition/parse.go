package definition

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

// Limits on a definition's size.
const (
	MaxSourceBytes    = 1 << 20
	MaxSteps          = 1000
	MaxTerminals      = 1000
	MaxTransitions    = 64
	MaxRetryAttempts  = 1000
	MaxPollAttempts   = 10000
	MaxDelay          = 7 * 24 * time.Hour
	MaxSignalTimeout  = 365 * 24 * time.Hour
	MaxRetryBudget    = 365 * 24 * time.Hour
	MaxMultiplier     = 100.0
	maxDiagnostics    = 100
	maxAliasHops      = 100
	nameMaxLen        = 128
	outcomeNameMaxLen = 64
)

var (
	terminalPattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)
	outcomePattern  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)
	yamlLinePattern = regexp.MustCompile(`^yaml: line (\d+): `)
)

// Parse reads a workflow definition. It returns the definition when it has
// no errors, every diagnostic found (warnings too, sorted by position), and a
// *ValidationError when any diagnostic is an error. Parse never panics on
// bad input.
func Parse(src []byte) (*Definition, []Diagnostic, error) {
	p := &parser{broken: map[string]bool{}, brokenPlans: map[string]bool{}}
	def := p.parse(src)
	if def != nil {
		validate(def, p)
	}
	diags := p.sorted()
	for _, d := range diags {
		if d.Severity == Error {
			return nil, diags, &ValidationError{Diagnostics: diags}
		}
	}
	return def, diags, nil
}

// Validate returns every diagnostic of a source, for dry runs.
func Validate(src []byte) []Diagnostic {
	_, diags, _ := Parse(src)
	return diags
}

type parser struct {
	diags     []Diagnostic
	truncated bool
	// broken holds step names that were written but could not be read
	// (malformed names or bodies); transitions to them are not reported
	// again as going nowhere.
	broken map[string]bool
	// brokenPlans is broken for plans: steps running them are not reported
	// again as naming no plan.
	brokenPlans map[string]bool
	// plansUnread is set when the plans section itself could not be read.
	plansUnread bool
}

func (p *parser) add(sev Severity, code Code, at Position, path, format string, args ...any) {
	if len(p.diags) >= maxDiagnostics {
		p.truncated = true
		return
	}
	p.diags = append(p.diags, Diagnostic{Code: code, Severity: sev, Pos: at, Path: path, Message: fmt.Sprintf(format, args...)})
}

func (p *parser) errorf(code Code, n *yaml.Node, path, format string, args ...any) {
	p.add(Error, code, pos(n), path, format, args...)
}

func (p *parser) warnf(code Code, n *yaml.Node, path, format string, args ...any) {
	p.add(Warning, code, pos(n), path, format, args...)
}

func (p *parser) sorted() []Diagnostic {
	sort.SliceStable(p.diags, func(i, j int) bool {
		a, b := p.diags[i].Pos, p.diags[j].Pos
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
	if p.truncated {
		// The cap keeps a hostile document from costing unbounded memory;
		// saying so keeps the cut visible.
		p.diags[len(p.diags)-1].Message += fmt.Sprintf(" (stopped after %d diagnostics)", maxDiagnostics)
	}
	return p.diags
}

func pos(n *yaml.Node) Position {
	if n == nil {
		return Position{}
	}
	return Position{Line: n.Line, Column: n.Column}
}

func (p *parser) parse(src []byte) *Definition {
	if len(src) > MaxSourceBytes {
		p.add(Error, CodeDocument, Position{Line: 1, Column: 1}, "", "the definition is %d bytes; the limit is %d", len(src), MaxSourceBytes)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.add(Error, CodeDocument, Position{Line: 1, Column: 1}, "", "the definition is empty")
			return nil
		}
		p.syntaxError(err)
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.errorf(CodeDocument, &extra, "", "the source holds more than one YAML document; put one workflow in each file")
		return nil
	} else if !errors.Is(err, io.EOF) {
		p.syntaxError(err)
		return nil
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	root = p.deref(root, "")
	if root == nil {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		p.errorf(CodeDocument, root, "", "a workflow definition is a mapping of fields (kind, name, version, start, …), not %s", describe(root))
		return nil
	}
	return p.definition(root)
}

func (p *parser) syntaxError(err error) {
	msg := err.Error()
	at := Position{}
	if m := yamlLinePattern.FindStringSubmatch(msg); m != nil {
		if line, convErr := strconv.Atoi(m[1]); convErr == nil {
			at.Line = line
		}
		msg = msg[len(m[0]):]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	p.add(Error, CodeSyntax, at, "", "invalid YAML: %s", msg)
}

// deref follows aliases to the node they name.
func (p *parser) deref(n *yaml.Node, path string) *yaml.Node {
	for hops := 0; n != nil && n.Kind == yaml.AliasNode; hops++ {
		if hops == maxAliasHops || n.Alias == nil {
			p.errorf(CodeType, n, path, "alias *%s does not resolve", n.Value)
			return nil
		}
		n = n.Alias
	}
	return n
}

// describe names what a node is, for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "empty"
		case "!!str":
			return fmt.Sprintf("the string %q", clip(n.Value))
		case "!!int", "!!float":
			return "the number " + clip(n.Value)
		case "!!bool":
			return "the boolean " + n.Value
		}
		return fmt.Sprintf("a %s value", n.Tag)
	}
	return "an unexpected node"
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// field is one key and value of a mapping.
type field struct {
	name  string
	key   *yaml.Node
	value *yaml.Node
	path  string
}

// pairs returns the entries of a mapping node, reporting keys that are not
// strings, merge keys, and keys written twice (with dupCode).
func (p *parser) pairs(n *yaml.Node, path string, dupCode Code, dupWhat string) []field {
	var out []field
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			p.errorf(CodeMergeKey, k, path, "merge keys (<<) are not supported; write the fields out or alias the whole value")
			continue
		}
		k = p.deref(k, path)
		if k == nil {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.errorf(CodeType, k, path, "a key must be a name, not %s", describe(k))
			continue
		}
		fp := join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			p.errorf(dupCode, k, fp, "%s %q is written twice (first at %s)", dupWhat, k.Value, pos(first))
			continue
		}
		seen[k.Value] = k
		v = p.deref(v, fp)
		if v == nil {
			continue
		}
		out = append(out, field{name: k.Value, key: k, value: v, path: fp})
	}
	return out
}

// object reads a mapping with a fixed set of fields, reporting unknown ones.
// It returns the known fields by name, or nil when n is not a mapping.
func (p *parser) object(n *yaml.Node, path, what string, known []string) map[string]field {
	if n.Kind != yaml.MappingNode {
		p.errorf(CodeType, n, path, "%s must be a mapping, not %s", what, describe(n))
		return nil
	}
	out := map[string]field{}
	for _, f := range p.pairs(n, path, CodeDuplicateKey, "field") {
		if !contains(known, f.name) {
			p.errorf(CodeUnknownField, f.key, f.path, "unknown field %q in %s%s; known fields: %s", f.name, what, suggest(f.name, known), strings.Join(known, ", "))
			continue
		}
		out[f.name] = f
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// suggest returns " (did you mean X?)" for the known name closest to s, when
// one is close: the same but for case, '_' and '-', or within two edits (three
// for names of five letters or more).
func suggest(s string, known []string) string {
	norm := func(x string) string {
		return strings.ToLower(strings.ReplaceAll(strings.ReplaceAll(x, "_", ""), "-", ""))
	}
	best, bestDist := "", 0
	for _, k := range known {
		if norm(k) == norm(s) {
			return fmt.Sprintf(" (did you mean %s?)", k)
		}
		limit := 2
		if min(len(s), len(k)) >= 5 {
			limit = 3
		}
		if d := editDistance(strings.ToLower(s), strings.ToLower(k)); d <= limit && (best == "" || d < bestDist) {
			best, bestDist = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", best)
}

// editDistance is the Levenshtein distance, bounded in cost by the short
// inputs it is used on (names of fields, steps and terminals).
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// str reads a string scalar. allowNumbers accepts numbers as their written
// text, for versions like 1.0.
func (p *parser) str(f field, allowNumbers bool) (string, bool) {
	n := f.value
	if n.Kind == yaml.ScalarNode {
		switch n.Tag {
		case "!!str":
			return n.Value, true
		case "!!int", "!!float":
			if allowNumbers {
				return n.Value, true
			}
		}
	}
	p.errorf(CodeType, n, f.path, "%s must be a string, not %s", f.name, describe(n))
	return "", false
}

// integer reads an integer scalar.
func (p *parser) integer(f field) (int64, bool) {
	n := f.value
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		var v int64
		if err := n.Decode(&v); err == nil {
			return v, true
		}
		p.errorf(CodeType, n, f.path, "%s %s does not fit in 64 bits", f.name, clip(n.Value))
		return 0, false
	}
	p.errorf(CodeType, n, f.path, "%s must be a whole number, not %s", f.name, describe(n))
	return 0, false
}

// number reads an integer or float scalar.
func (p *parser) number(f field) (float64, bool) {
	n := f.value
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!int" || n.Tag == "!!float") {
		var v float64
		if err := n.Decode(&v); err == nil && !math.IsNaN(v) && !math.IsInf(v, 0) {
			return v, true
		}
	}
	p.errorf(CodeType, n, f.path, "%s must be a finite number, not %s", f.name, describe(n))
	return 0, false
}

// millis reads a millisecond count into a duration, within [lo, hi].
func (p *parser) millis(f field, code Code, lo, hi time.Duration) (time.Duration, bool) {
	v, ok := p.integer(f)
	if !ok {
		return 0, false
	}
	if v < lo.Milliseconds() || v > hi.Milliseconds() {
		p.errorf(code, f.value, f.path, "%s must be between %d and %d milliseconds, not %d", f.name, lo.Milliseconds(), hi.Milliseconds(), v)
		return 0, false
	}
	return time.Duration(v) * time.Millisecond, true
}

var topFields = []string{"kind", "name", "version", "idempotency", "start", "steps", "terminals", "plans", "schedule", "trigger", "searchAttributes"}

func (p *parser) definition(root *yaml.Node) *Definition {
	fields := p.object(root, "", "the workflow", topFields)
	def := &Definition{Idempotency: IdempotencyNone, Steps: map[string]*Step{}, Terminals: map[string]Terminal{}, Plans: map[string]*Plan{}}
	required := func(name string) (field, bool) {
		f, ok := fields[name]
		if !ok {
			p.errorf(CodeMissingField, root, name, "the workflow needs a %s field", name)
			return field{}, false
		}
		if f.value.Kind == yaml.ScalarNode && (f.value.Tag == "!!null" || (f.value.Tag == "!!str" && f.value.Value == "")) {
			p.errorf(CodeMissingField, f.value, name, "%s must not be empty", name)
			return field{}, false
		}
		return f, true
	}
	if f, ok := required("kind"); ok {
		if v, ok := p.str(f, false); ok && v != Kind {
			p.errorf(CodeKind, f.value, f.path, "kind must be %s, not %q", Kind, clip(v))
		}
	}
	if f, ok := required("name"); ok {
		if v, ok := p.str(f, false); ok {
			if text.Name("name", v) != nil {
				p.errorf(CodeName, f.value, f.path, "workflow name %q is invalid: use 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", clip(v), nameMaxLen)
			}
			def.Name = v
		}
	}
	if f, ok := required("version"); ok {
		if v, ok := p.str(f, true); ok {
			if text.Version("version", v) != nil {
				p.errorf(CodeName, f.value, f.path, "version %q is invalid: use 1 to %d letters, digits, '.', '_', '+' or '-', starting with a letter or digit", clip(v), text.MaxVersionBytes)
			}
			def.Version = v
		}
	}
	if f, ok := fields["idempotency"]; ok {
		if v, ok := p.str(f, false); ok {
			switch Idempotency(v) {
			case IdempotencyNone, IdempotencyOptional, IdempotencyRequired:
				def.Idempotency = Idempotency(v)
			default:
				p.errorf(CodeIdempotency, f.value, f.path, "idempotency must be none, optional or required, not %q", clip(v))
			}
		}
	}
	if f, ok := fields["terminals"]; ok {
		p.terminals(f, def)
	}
	if f, ok := fields["plans"]; ok {
		p.plans(f, def)
	}
	if f, ok := fields["schedule"]; ok {
		p.schedule(f, def)
	}
	if f, ok := fields["searchAttributes"]; ok {
		p.searchAttributes(f, def)
	}
	if f, ok := fields["trigger"]; ok {
		p.trigger(f, def)
	}
	if f, ok := fields["steps"]; ok {
		p.steps(f, def)
	}
	if f, ok := required("start"); ok {
		def.Start = p.step(f.value, StartStep, "start")
	}
	return def
}

// section reads a section that maps names to entries (terminals, steps,
// plans): nil when it is empty, not a mapping, or holds more than limit
// entries. shape says what it maps to, for messages; what names one entry.
func (p *parser) section(f field, shape, what string, dupCode Code, limit int) []field {
	if f.value.Kind != yaml.MappingNode {
		if f.value.Tag != "!!null" {
			p.errorf(CodeType, f.value, f.path, "%s must be a mapping of %s, not %s", f.name, shape, describe(f.value))
		}
		return nil
	}
	entries := p.pairs(f.value, f.path, dupCode, what)
	if len(entries) > limit {
		p.errorf(CodeLimit, f.key, f.path, "%d %ss; the limit is %d", len(entries), what, limit)
		return nil
	}
	return entries
}

func (p *parser) terminals(f field, def *Definition) {
	for _, e := range p.section(f, "name to {status: …}", "terminal", CodeDuplicateTerminal, MaxTerminals) {
		switch {
		case strings.HasPrefix(e.name, "flo."):
			p.errorf(CodeTerminal, e.key, e.path, "terminal name %q is reserved: names starting with flo. are built in", clip(e.name))
			continue
		case len(e.name) > nameMaxLen || !terminalPattern.MatchString(e.name):
			p.errorf(CodeTerminal, e.key, e.path, "terminal name %q is invalid: use a letter, then letters, digits, '_' or '-'", clip(e.name))
			continue
		}
		t := Terminal{Name: e.name, Pos: pos(e.key)}
		fields := p.object(e.value, e.path, "a terminal", []string{"status"})
		if fields == nil {
			continue
		}
		sf, ok := fields["status"]
		if !ok {
			p.errorf(CodeTerminal, e.key, e.path, "terminal %s needs a status: completed, failed, cancelled or timed_out", e.name)
			continue
		}
		v, ok := p.str(sf, false)
		if !ok {
			continue
		}
		switch Status(v) {
		case StatusCompleted, StatusFailed, StatusCancelled, StatusTimedOut:
			t.Status = Status(v)
		default:
			p.errorf(CodeTerminal, sf.value, sf.path, "status must be completed, failed, cancelled or timed_out, not %q", clip(v))
			continue
		}
		def.Terminals[e.name] = t
	}
}

func (p *parser) steps(f field, def *Definition) {
	for _, e := range p.section(f, "step name to step", "step", CodeDuplicateStep, MaxSteps) {
		switch {
		case e.name == StartStep:
			p.errorf(CodeStepName, e.key, e.path, "step name %s is reserved for the start step", StartStep)
			continue
		case len(e.name) > nameMaxLen || !mapping.IsStepName(e.name):
			p.errorf(CodeStepName, e.key, e.path, "step name %q is invalid: use a letter or '_', then letters, digits, '_' or '-'", clip(e.name))
			p.broken[e.name] = true
			continue
		}
		s := p.step(e.value, e.name, e.path)
		if s == nil {
			p.broken[e.name] = true
			continue
		}
		s.Pos = pos(e.key)
		def.Steps[e.name] = s
		def.StepOrder = append(def.StepOrder, e.name)
	}
}

var stepFields = []string{"run", "waitForSignal", "inputMapping", "retry", "poll", "transitions"}

// step reads one step. It returns nil only when n is not a mapping; a step
// with errors is still returned so later checks see its transitions.
func (p *parser) step(n *yaml.Node, name, path string) *Step {
	fields := p.object(n, path, "a step", stepFields)
	if fields == nil {
		return nil
	}
	s := &Step{Name: name, Pos: pos(n), Transitions: map[string]string{}, transitionPos: map[string]Position{}}
	run, hasRun := fields["run"]
	wait, hasWait := fields["waitForSignal"]
	switch {
	case hasRun && hasWait:
		p.errorf(CodeStepKind, wait.key, path, "a step either runs a target or waits for a signal: remove run or waitForSignal")
	case !hasRun && !hasWait:
		p.errorf(CodeStepKind, n, path, "the step needs run (a target) or waitForSignal")
	case hasRun:
		if v, ok := p.str(run, false); ok {
			s.Run = p.target(run, v)
			s.runPos = pos(run.value)
		}
	default:
		s.Wait = p.waitForSignal(wait)
		for _, name := range []string{"retry", "poll", "inputMapping"} {
			if f, ok := fields[name]; ok {
				p.errorf(CodeRunOnly, f.key, f.path, "%s applies to run steps only, not to waitForSignal steps", name)
			}
		}
	}
	isRun := hasRun && !hasWait
	if f, ok := fields["inputMapping"]; ok && isRun {
		s.InputMapping = p.inputMapping(f)
		s.inputMappingPos = pos(f.value)
	}
	if f, ok := fields["retry"]; ok && isRun {
		s.Retry = p.retry(f)
	}
	if f, ok := fields["poll"]; ok && isRun {
		s.Poll = p.poll(f)
	}
	if f, ok := fields["transitions"]; ok {
		p.transitions(f, s)
	}
	switch {
	case hasWait && !hasRun:
		if _, ok := s.Transitions[OutcomeSuccess]; !ok && !p.hasErrorAt(join(path, "transitions")) {
			p.errorf(CodeNoTransitions, n, path, "a waitForSignal step needs a success transition: where the run goes when the signal arrives")
		}
	case hasRun && len(s.Transitions) == 0 && !p.hasErrorAt(join(path, "transitions")):
		p.errorf(CodeNoTransitions, n, path, "the step needs transitions: at least where success goes")
	}
	if s.Poll != nil {
		if _, ok := s.Transitions[OutcomeTimeout]; !ok {
			p.warnf(CodePollWithoutTimeoutTo, fields["poll"].key, join(path, "poll"), "no timeout transition: when %d polls still report pending the run fails", s.Poll.MaxAttempts)
		}
	}
	return s
}

// hasErrorAt reports whether an error was already reported at or under
// path, so one mistake is not reported twice.
func (p *parser) hasErrorAt(path string) bool {
	for _, d := range p.diags {
		if d.Severity == Error && (d.Path == path || strings.HasPrefix(d.Path, path+".")) {
			return true
		}
	}
	return false
}

// target parses @actions/NAME, @workflow/NAME[:VERSION] or @plan/NAME.
func (p *parser) target(f field, v string) *Target {
	kind, rest, ok := strings.Cut(strings.TrimPrefix(v, "@"), "/")
	if !strings.HasPrefix(v, "@") || !ok {
		p.errorf(CodeTarget, f.value, f.path, "run target %q must be @actions/NAME, @workflow/NAME[:VERSION] or @plan/NAME", clip(v))
		return nil
	}
	t := &Target{Kind: TargetKind(kind), Name: rest}
	switch t.Kind {
	case TargetAction, TargetPlan:
	case TargetWorkflow:
		if name, version, hasVersion := strings.Cut(rest, ":"); hasVersion {
			t.Name, t.Version = name, version
			if text.Version("version", version) != nil {
				p.errorf(CodeTargetVersion, f.value, f.path, "version %q in %q is invalid: use 1 to %d letters, digits, '.', '_', '+' or '-', or leave out :VERSION for the latest", clip(version), clip(v), text.MaxVersionBytes)
				return nil
			}
		}
	default:
		p.errorf(CodeTarget, f.value, f.path, "run target %q has an unknown prefix @%s/; use @actions/, @workflow/ or @plan/", clip(v), clip(kind))
		return nil
	}
	if t.Name == "" {
		p.errorf(CodeTarget, f.value, f.path, "run target %q names nothing after @%s/", clip(v), kind)
		return nil
	}
	if text.Name("name", t.Name) != nil {
		p.errorf(CodeTargetName, f.value, f.path, "name %q in %q is invalid: use 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", clip(t.Name), clip(v), nameMaxLen)
		return nil
	}
	return t
}

func (p *parser) inputMapping(f field) *mapping.Template {
	src, ok := p.str(f, false)
	if !ok {
		return nil
	}
	t, err := mapping.Compile(src)
	if err != nil {
		var se *mapping.SyntaxError
		if errors.As(err, &se) {
			p.errorf(CodeMappingPath, f.value, f.path, "%s", err)
			return nil
		}
		p.errorf(CodeInputMapping, f.value, f.path, "%s; write it as a JSON object in a string, e.g. '{\"amount\": \"$.input.amount\"}'", err)
		return nil
	}
	return t
}

var signalFields = []string{"type", "timeoutMs", "onTimeout"}

func (p *parser) waitForSignal(f field) *WaitForSignal {
	fields := p.object(f.value, f.path, "waitForSignal", signalFields)
	if fields == nil {
		return nil
	}
	w := &WaitForSignal{}
	if tf, ok := fields["type"]; !ok {
		p.errorf(CodeSignalType, f.key, f.path, "waitForSignal needs the type of signal it waits for")
	} else if v, ok := p.str(tf, false); ok {
		if text.SignalType("type", v) != nil {
			p.errorf(CodeSignalType, tf.value, tf.path, "signal type %q is invalid: use 1 to %d letters, digits, '_', '.', ':' or '-'", clip(v), text.MaxSignalTypeBytes)
		}
		w.Type = v
	}
	if tf, ok := fields["timeoutMs"]; ok {
		if d, ok := p.millis(tf, CodeSignalTimeout, time.Millisecond, MaxSignalTimeout); ok {
			w.Timeout = d
		}
	}
	if of, ok := fields["onTimeout"]; ok {
		if v, ok := p.str(of, false); ok {
			w.OnTimeout = v
			w.onTimeoutPos = pos(of.value)
			if _, hasTimeout := fields["timeoutMs"]; !hasTimeout {
				p.errorf(CodeOnTimeoutNoTimeout, of.key, of.path, "onTimeout never fires without timeoutMs")
			}
		}
	}
	if _, ok := fields["timeoutMs"]; !ok {
		p.warnf(CodeNoSignalTimeout, f.key, f.path, "no timeoutMs: the run waits for a %q signal forever", w.Type)
	}
	return w
}

var retryFields = []string{"max_attempts", "backoff", "initial_delay_ms", "max_delay_ms", "multiplier", "within_ms"}

func (p *parser) retry(f field) *Retry {
	fields := p.object(f.value, f.path, "retry", retryFields)
	if fields == nil {
		return nil
	}
	r := &Retry{MaxAttempts: DefaultRetryMaxAttempts, Backoff: DefaultBackoff, InitialDelay: DefaultDelay, Multiplier: DefaultMultiplier}
	if af, ok := fields["max_attempts"]; ok {
		if v, ok := p.integer(af); ok {
			if v < 1 || v > MaxRetryAttempts {
				p.errorf(CodeMaxAttempts, af.value, af.path, "max_attempts counts every attempt, the first included: it must be between 1 and %d, not %d", MaxRetryAttempts, v)
			} else {
				r.MaxAttempts = int(v)
			}
		}
	}
	r.Backoff = p.backoffKind(fields["backoff"], r.Backoff)
	initial, hasInitial := fields["initial_delay_ms"]
	if hasInitial {
		if d, ok := p.millis(initial, CodeDelay, 0, MaxDelay); ok {
			r.InitialDelay = d
		}
	}
	r.MaxDelay = max(DefaultMaxDelay, r.InitialDelay)
	if mf, ok := fields["max_delay_ms"]; ok {
		if d, ok := p.millis(mf, CodeDelay, 0, MaxDelay); ok {
			r.MaxDelay = d
			if hasInitial && d < r.InitialDelay {
				p.errorf(CodeDelay, mf.value, mf.path, "max_delay_ms %d is less than initial_delay_ms %d", d.Milliseconds(), r.InitialDelay.Milliseconds())
			} else if d < r.InitialDelay {
				r.InitialDelay = d
			}
		}
	}
	r.Multiplier = p.multiplier(fields["multiplier"], r.Multiplier)
	if wf, ok := fields["within_ms"]; ok {
		if d, ok := p.millis(wf, CodeDelay, time.Millisecond, MaxRetryBudget); ok {
			r.Within = d
		}
	}
	return r
}

var pollFields = []string{"maxAttempts", "backoff", "initialDelayMs", "baseDelayMs", "maxDelayMs", "multiplier"}

func (p *parser) poll(f field) *Poll {
	fields := p.object(f.value, f.path, "poll", pollFields)
	if fields == nil {
		return nil
	}
	pl := &Poll{MaxAttempts: DefaultPollMaxAttempts, Backoff: DefaultBackoff, BaseDelay: DefaultDelay, Multiplier: DefaultMultiplier}
	if af, ok := fields["maxAttempts"]; ok {
		if v, ok := p.integer(af); ok {
			if v < 1 || v > MaxPollAttempts {
				p.errorf(CodeMaxAttempts, af.value, af.path, "maxAttempts must be between 1 and %d, not %d", MaxPollAttempts, v)
			} else {
				pl.MaxAttempts = int(v)
			}
		}
	}
	pl.Backoff = p.backoffKind(fields["backoff"], pl.Backoff)
	base, hasBase := fields["baseDelayMs"]
	if hasBase {
		if d, ok := p.millis(base, CodeDelay, 0, MaxDelay); ok {
			pl.BaseDelay = d
		}
	}
	pl.InitialDelay = pl.BaseDelay
	if inf, ok := fields["initialDelayMs"]; ok {
		if d, ok := p.millis(inf, CodeDelay, 0, MaxDelay); ok {
			pl.InitialDelay = d
		}
	}
	pl.MaxDelay = max(DefaultMaxDelay, pl.BaseDelay)
	if mf, ok := fields["maxDelayMs"]; ok {
		if d, ok := p.millis(mf, CodeDelay, 0, MaxDelay); ok {
			pl.MaxDelay = d
			if hasBase && d < pl.BaseDelay {
				p.errorf(CodeDelay, mf.value, mf.path, "maxDelayMs %d is less than baseDelayMs %d", d.Milliseconds(), pl.BaseDelay.Milliseconds())
			} else if d < pl.BaseDelay {
				pl.BaseDelay = d
			}
		}
	}
	pl.Multiplier = p.multiplier(fields["multiplier"], pl.Multiplier)
	return pl
}

var backoffKinds = []string{string(backoff.Constant), string(backoff.Linear), string(backoff.Exponential), string(backoff.ExponentialJitter)}

func (p *parser) backoffKind(f field, def backoff.Kind) backoff.Kind {
	if f.value == nil {
		return def
	}
	v, ok := p.str(f, false)
	if !ok {
		return def
	}
	if !contains(backoffKinds, v) {
		p.errorf(CodeBackoff, f.value, f.path, "backoff %q is not one of %s%s", clip(v), strings.Join(backoffKinds, ", "), suggest(v, backoffKinds))
		return def
	}
	return backoff.Kind(v)
}

func (p *parser) multiplier(f field, def float64) float64 {
	if f.value == nil {
		return def
	}
	v, ok := p.number(f)
	if !ok {
		return def
	}
	if v < 1 || v > MaxMultiplier {
		p.errorf(CodeMultiplier, f.value, f.path, "multiplier must be between 1 and %g, not %g", MaxMultiplier, v)
		return def
	}
	return v
}

func (p *parser) transitions(f field, s *Step) {
	if f.value.Kind != yaml.MappingNode {
		p.errorf(CodeType, f.value, f.path, "transitions must be a mapping of outcome to step or terminal, not %s", describe(f.value))
		return
	}
	entries := p.pairs(f.value, f.path, CodeDuplicateKey, "outcome")
	if len(entries) > MaxTransitions {
		p.errorf(CodeLimit, f.key, f.path, "%d transitions; the limit is %d", len(entries), MaxTransitions)
		return
	}
	for _, e := range entries {
		if len(e.name) > outcomeNameMaxLen || !outcomePattern.MatchString(e.name) {
			p.errorf(CodeOutcomeName, e.key, e.path, "outcome %q is invalid: use 1 to %d letters, digits, '_', '.' or '-'", clip(e.name), outcomeNameMaxLen)
			continue
		}
		if s.Wait != nil && e.name != OutcomeSuccess {
			p.errorf(CodeSignalOutcome, e.key, e.path, "a waitForSignal step has only a success transition; use waitForSignal.onTimeout for what happens on timeout")
			continue
		}
		v, ok := p.str(e, false)
		if !ok {
			continue
		}
		if v == "" {
			p.errorf(CodeTransitionTarget, e.value, e.path, "the %s transition names no step or terminal", e.name)
			continue
		}
		s.Transitions[e.name] = v
		s.transitionPos[e.name] = pos(e.value)
	}
}
