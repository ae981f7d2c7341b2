package record

import (
	"strings"

	"github.com/razorbill/flo/libs/fault"
)

// StartKind says where a read or a group starts.
type StartKind int

// Where a read or group starts.
const (
	// FromFirst starts at the first record held ("-" or empty).
	FromFirst StartKind = iota
	// FromNew starts with the next record appended ("$").
	FromNew
	// FromID starts at the record with ID or the first after it.
	FromID
	// AfterID starts at the first record after ID ("(ID").
	AfterID
)

// Start is a parsed start position.
type Start struct {
	Kind StartKind
	ID   ID
}

// Includes reports whether a record with id is at or after the start; every
// record is for FromFirst and FromNew, whose offsets decide instead.
func (s Start) Includes(id ID) bool {
	switch s.Kind {
	case FromID:
		return id.Compare(s.ID) >= 0
	case AfterID:
		return id.Compare(s.ID) > 0
	}
	return true
}

// ParseStart parses a start: "" or "-", "$", "(ID" (only when exclusive is
// allowed) or ID. field names the request field in errors.
func ParseStart(field, s string, exclusive bool) (Start, error) {
	switch {
	case s == "" || s == "-":
		return Start{Kind: FromFirst}, nil
	case s == "$":
		return Start{Kind: FromNew}, nil
	case strings.HasPrefix(s, "("):
		if !exclusive {
			return Start{}, fault.Invalidf("%s %q: want \"-\", \"$\" or a record id", field, s)
		}
		id, err := ParseID(s[1:])
		if err != nil {
			return Start{}, prefix(field, err)
		}
		return Start{Kind: AfterID, ID: id}, nil
	}
	id, err := ParseID(s)
	if err != nil {
		return Start{}, prefix(field, err)
	}
	return Start{Kind: FromID, ID: id}, nil
}

// End is a parsed inclusive end position; Open means no end.
type End struct {
	Open bool
	ID   ID
}

// Includes reports whether a record with id is at or before the end.
func (e End) Includes(id ID) bool { return e.Open || id.Compare(e.ID) <= 0 }

// ParseEnd parses an end: "" or "+" for none, or an id.
func ParseEnd(field, s string) (End, error) {
	if s == "" || s == "+" {
		return End{Open: true}, nil
	}
	id, err := ParseID(s)
	if err != nil {
		return End{}, prefix(field, err)
	}
	return End{ID: id}, nil
}

func prefix(field string, err error) error {
	if kind, msg, ok := fault.KindOf(err); ok {
		return &fault.Error{Kind: kind, Message: field + ": " + msg}
	}
	return err
}
