// Package query is the language runs are listed by (flo workflow runs
// --where): comparisons of search attributes and built-in fields with
// literals, joined by AND and OR, with parentheses:
//
//	customer_id = "c-42" AND (order_amount > 100 OR status IN ("failed", "timed_out"))
//
// Parse reads a query into a tree and reports syntax errors with the
// position they were found at; Check resolves each field against the
// attributes the workflows declare and the built-in fields, and converts
// every literal to the field's type. Package store turns the checked query
// into SQL with every literal a parameter.
package query

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/razorbill/flo/libs/fault"
)

// Limits on a query's size, so one cannot cost unbounded parsing or SQL.
const (
	MaxBytes       = 4096
	MaxComparisons = 64
	MaxInValues    = 1000
	maxDepth       = 32
)

// Op is a comparison operator.
type Op string

// The operators.
const (
	OpEq Op = "="
	OpNe Op = "!="
	OpLt Op = "<"
	OpLe Op = "<="
	OpGt Op = ">"
	OpGe Op = ">="
	OpIn Op = "IN"
)

// Expr is a query or part of one: *Bool or *Comparison.
type Expr interface {
	// Pos is the 1-based byte offset the expression starts at.
	Pos() int
}

// Bool joins two expressions with AND or OR.
type Bool struct {
	Or          bool
	Left, Right Expr
}

// Pos implements Expr.
func (b *Bool) Pos() int { return b.Left.Pos() }

// Literal is a string or number written in a query.
type Literal struct {
	// Value is a string or a float64.
	Value any
	At    int
}

// Comparison compares a field with one literal, or with a list for IN.
type Comparison struct {
	Field  string
	Op     Op
	Values []Literal
	At     int
}

// Pos implements Expr.
func (c *Comparison) Pos() int { return c.At }

// Error is a query that cannot be parsed or checked, with the 1-based byte
// offset of the problem.
type Error struct {
	Pos     int
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("where: at %d: %s", e.Pos, e.Message) }

// Unwrap makes the error an Invalid domain error (libs/fault).
func (e *Error) Unwrap() error { return &fault.Error{Kind: fault.Invalid, Message: e.Error()} }

func errorf(pos int, format string, args ...any) *Error {
	return &Error{Pos: pos, Message: fmt.Sprintf(format, args...)}
}

// Parse reads a query. An empty or blank query is nil: it filters nothing.
func Parse(src string) (Expr, error) {
	if len(src) > MaxBytes {
		return nil, errorf(1, "the query is %d bytes; the limit is %d", len(src), MaxBytes)
	}
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	if len(toks) == 1 {
		return nil, nil
	}
	p := &parser{toks: toks}
	e, err := p.or(0)
	if err != nil {
		return nil, err
	}
	if t := p.peek(); t.kind != tokEOF {
		return nil, errorf(t.pos, "expected AND, OR or the end of the query, found %s", t)
	}
	return e, nil
}

type parser struct {
	toks        []token
	i           int
	comparisons int
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tokEOF {
		p.i++
	}
	return t
}

// or reads a chain of ANDs joined by OR: AND binds tighter.
func (p *parser) or(depth int) (Expr, error) {
	left, err := p.and(depth)
	if err != nil {
		return nil, err
	}
	for p.peek().is(tokKeyword, "OR") {
		p.next()
		right, err := p.and(depth)
		if err != nil {
			return nil, err
		}
		left = &Bool{Or: true, Left: left, Right: right}
	}
	return left, nil
}

func (p *parser) and(depth int) (Expr, error) {
	left, err := p.primary(depth)
	if err != nil {
		return nil, err
	}
	for p.peek().is(tokKeyword, "AND") {
		p.next()
		right, err := p.primary(depth)
		if err != nil {
			return nil, err
		}
		left = &Bool{Left: left, Right: right}
	}
	return left, nil
}

func (p *parser) primary(depth int) (Expr, error) {
	t := p.next()
	switch t.kind {
	case tokPunct:
		if t.text != "(" {
			break
		}
		if depth == maxDepth {
			return nil, errorf(t.pos, "parentheses nest more than %d deep", maxDepth)
		}
		e, err := p.or(depth + 1)
		if err != nil {
			return nil, err
		}
		if c := p.next(); !c.is(tokPunct, ")") {
			return nil, errorf(c.pos, "expected ) to close the ( at %d, found %s", t.pos, c)
		}
		return e, nil
	case tokIdent:
		return p.comparison(t)
	}
	return nil, errorf(t.pos, "expected a field name or (, found %s", t)
}

func (p *parser) comparison(field token) (Expr, error) {
	p.comparisons++
	if p.comparisons > MaxComparisons {
		return nil, errorf(field.pos, "more than %d comparisons", MaxComparisons)
	}
	c := &Comparison{Field: field.text, At: field.pos}
	op := p.next()
	switch {
	case op.kind == tokOp:
		c.Op = Op(op.text)
		lit, err := p.literal()
		if err != nil {
			return nil, err
		}
		c.Values = []Literal{lit}
		return c, nil
	case op.is(tokKeyword, "IN"):
		c.Op = OpIn
		if t := p.next(); !t.is(tokPunct, "(") {
			return nil, errorf(t.pos, "expected ( after IN, found %s", t)
		}
		for {
			if len(c.Values) == MaxInValues {
				return nil, errorf(p.peek().pos, "more than %d values in one IN list", MaxInValues)
			}
			lit, err := p.literal()
			if err != nil {
				return nil, err
			}
			c.Values = append(c.Values, lit)
			t := p.next()
			if t.is(tokPunct, ")") {
				return c, nil
			}
			if !t.is(tokPunct, ",") {
				return nil, errorf(t.pos, "expected , or ) in the IN list, found %s", t)
			}
		}
	}
	return nil, errorf(op.pos, "expected an operator (=, !=, <, <=, >, >=, IN) after %s, found %s", field.text, op)
}

func (p *parser) literal() (Literal, error) {
	t := p.next()
	switch t.kind {
	case tokString:
		return Literal{Value: t.text, At: t.pos}, nil
	case tokNumber:
		return Literal{Value: t.num, At: t.pos}, nil
	}
	return Literal{}, errorf(t.pos, "expected a value (a \"string\" or a number), found %s", t)
}

type tokenKind int

const (
	tokEOF tokenKind = iota
	tokIdent
	tokKeyword
	tokString
	tokNumber
	tokOp
	tokPunct
)

type token struct {
	kind tokenKind
	text string
	num  float64
	pos  int
}

func (t token) is(kind tokenKind, text string) bool { return t.kind == kind && t.text == text }

func (t token) String() string {
	switch t.kind {
	case tokEOF:
		return "the end of the query"
	case tokString:
		return "the string " + strconv.Quote(clip(t.text))
	case tokNumber:
		return "the number " + clip(t.text)
	case tokKeyword:
		return t.text
	}
	return strconv.Quote(clip(t.text))
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

var keywords = []string{"AND", "OR", "IN"}

// lex splits a query into tokens, ending with tokEOF.
func lex(src string) ([]token, error) {
	var toks []token
	for i := 0; i < len(src); {
		c := src[i]
		pos := i + 1
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case isLetter(c):
			j := i + 1
			for j < len(src) && isNameByte(src[j]) {
				j++
			}
			word := src[i:j]
			if up := strings.ToUpper(word); contains(keywords, up) {
				toks = append(toks, token{kind: tokKeyword, text: up, pos: pos})
			} else {
				toks = append(toks, token{kind: tokIdent, text: word, pos: pos})
			}
			i = j
		case c == '"' || c == '\'':
			s, n, err := lexString(src[i:], pos)
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{kind: tokString, text: s, pos: pos})
			i += n
		case c == '-' || c == '.' || c >= '0' && c <= '9':
			j := i + 1
			for j < len(src) && (isNameByte(src[j]) || (src[j] == '+' || src[j] == '-') && (src[j-1] == 'e' || src[j-1] == 'E')) {
				j++
			}
			text := src[i:j]
			n, err := strconv.ParseFloat(text, 64)
			if err != nil || strings.ContainsAny(text, "xXpPnN_") {
				return nil, errorf(pos, "%q is not a number", clip(text))
			}
			toks = append(toks, token{kind: tokNumber, text: text, num: n, pos: pos})
			i = j
		default:
			op, ok := lexOp(src[i:])
			if !ok {
				return nil, errorf(pos, "unexpected character %q", rune(c))
			}
			kind := tokOp
			if op == "(" || op == ")" || op == "," {
				kind = tokPunct
			}
			i += len(op)
			if op == "<>" {
				op = string(OpNe)
			}
			toks = append(toks, token{kind: kind, text: op, pos: pos})
		}
	}
	return append(toks, token{kind: tokEOF, pos: len(src) + 1}), nil
}

// lexOp reads an operator or punctuation at the start of s.
func lexOp(s string) (string, bool) {
	for _, op := range []string{"<=", ">=", "!=", "<>", "=", "<", ">", "(", ")", ","} {
		if strings.HasPrefix(s, op) {
			return op, true
		}
	}
	return "", false
}

// lexString reads a quoted string at the start of s: "…" with Go escapes,
// or '…' with none. It returns the value and the bytes read.
func lexString(s string, pos int) (string, int, error) {
	q := s[0]
	for j := 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q == '"':
			j++
		case s[j] == q:
			if q == '\'' {
				return s[1:j], j + 1, nil
			}
			v, err := strconv.Unquote(s[:j+1])
			if err != nil {
				return "", 0, errorf(pos, "string %s has a bad escape", clip(s[:j+1]))
			}
			return v, j + 1, nil
		}
	}
	return "", 0, errorf(pos, "string is not closed: add %c", q)
}

func isLetter(b byte) bool { return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' }

// isNameByte is what attribute names are made of after their first letter.
func isNameByte(b byte) bool {
	return isLetter(b) || b >= '0' && b <= '9' || b == '_' || b == '.' || b == '-'
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
