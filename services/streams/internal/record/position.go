package record

import (
	"strconv"
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
	// AtCursor starts at an offset per partition ("@stream.o0.o1...", the
	// next of an earlier read).
	AtCursor
)

// Start is a parsed start position.
type Start struct {
	Kind StartKind
	ID   ID
	// Stream and Offsets are an AtCursor start's stream row id and the
	// offset to read on from in each partition.
	Stream  int64
	Offsets []int64
}

// Cursor formats the position of a read that goes on at offsets, one per
// partition, of the stream with row id stream. Ids order records of
// different partitions by millisecond only, so a follower resuming after
// an id could miss a record another partition got in the same millisecond;
// a cursor names exactly what was read of each partition.
func Cursor(stream int64, offsets []int64) string {
	b := make([]byte, 0, 8+8*len(offsets))
	b = append(b, '@')
	b = strconv.AppendInt(b, stream, 10)
	for _, o := range offsets {
		b = append(b, '.')
		b = strconv.AppendInt(b, o, 10)
	}
	return string(b)
}

func parseCursor(field, s string) (Start, error) {
	parts := strings.Split(s[1:], ".")
	nums := make([]int64, len(parts))
	for i, p := range parts {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 || p == "" || p[0] == '+' {
			return Start{}, fault.Invalidf("%s %q: not a read cursor (the next of an earlier read)", field, s)
		}
		nums[i] = n
	}
	if len(nums) < 2 {
		return Start{}, fault.Invalidf("%s %q: not a read cursor (the next of an earlier read)", field, s)
	}
	return Start{Kind: AtCursor, Stream: nums[0], Offsets: nums[1:]}, nil
}

// Includes reports whether a record with id is at or after the start; every
// record is for FromFirst, FromNew and AtCursor, whose offsets decide
// instead.
func (s Start) Includes(id ID) bool {
	switch s.Kind {
	case FromID:
		return id.Compare(s.ID) >= 0
	case AfterID:
		return id.Compare(s.ID) > 0
	}
	return true
}

// ParseStart parses a start: "" or "-", "$", ID, and for range reads "(ID"
// or a cursor. field names the request field in errors.
func ParseStart(field, s string, rangeRead bool) (Start, error) {
	switch {
	case s == "" || s == "-":
		return Start{Kind: FromFirst}, nil
	case s == "$":
		return Start{Kind: FromNew}, nil
	case strings.HasPrefix(s, "@") && rangeRead:
		return parseCursor(field, s)
	case strings.HasPrefix(s, "("):
		if !rangeRead {
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
