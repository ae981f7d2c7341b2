// Package fault holds the domain errors every service shares. Domain packages
// return them with a message meant for the caller; the gRPC edge
// (libs/grpcserver) maps their kind to a status code in one place, so no
// domain package knows about gRPC.
package fault

import (
	"errors"
	"fmt"
)

// Kind classifies a domain error.
type Kind int

// The kinds of domain error.
const (
	// NotFound: an entity that does not exist.
	NotFound Kind = iota + 1
	// Invalid: input that can never succeed as sent.
	Invalid
	// Precondition: the entity exists but is not in a state that allows the call.
	Precondition
	// Exhausted: a limit would be exceeded; it may succeed once others leave.
	Exhausted
)

// Error is a domain error with a caller-facing message.
type Error struct {
	Kind    Kind
	Message string
}

func (e *Error) Error() string { return e.Message }

// NotFoundf returns a NotFound error.
func NotFoundf(format string, args ...any) error {
	return &Error{Kind: NotFound, Message: fmt.Sprintf(format, args...)}
}

// Invalidf returns an Invalid error; the message should name the field.
func Invalidf(format string, args ...any) error {
	return &Error{Kind: Invalid, Message: fmt.Sprintf(format, args...)}
}

// Preconditionf returns a Precondition error.
func Preconditionf(format string, args ...any) error {
	return &Error{Kind: Precondition, Message: fmt.Sprintf(format, args...)}
}

// Exhaustedf returns an Exhausted error.
func Exhaustedf(format string, args ...any) error {
	return &Error{Kind: Exhausted, Message: fmt.Sprintf(format, args...)}
}

// KindOf returns the kind of the first domain error in err's chain and its
// message, or ok=false when err carries none.
func KindOf(err error) (kind Kind, message string, ok bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind, e.Message, true
	}
	return 0, "", false
}
