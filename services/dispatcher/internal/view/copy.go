package view

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"strings"
	"time"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// copySQL stages rows in PostgreSQL's binary COPY format, which copyReader
// writes.
var copySQL = `COPY view_batch (` + strings.Join(columns, ", ") + `) FROM STDIN (FORMAT binary)`

// copyHeader opens a binary COPY: its signature, no flags, no extension.
var copyHeader = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

// copyReader is the COPY data of states' rows, encoded as COPY reads them
// into one reused buffer. The rows are encoded here, for the tasks table's
// fixed column types, rather than by pgx's CopyFrom, which looks each
// value's encoder up by its type and boxes every value in an interface: that
// was 3.5% of a loaded process's CPU for 32 columns a row (docs/benchmarks.md,
// Session 29). The view's tests read every column back.
type copyReader struct {
	states  []*buffered
	next    int
	started bool
	ended   bool
	// buf holds what was encoded and not read yet, from off.
	buf []byte
	off int
}

// Read fills p with the next rows' bytes; the last Read ends the data.
func (r *copyReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if r.off == len(r.buf) && !r.fill() {
			break
		}
		c := copy(p[n:], r.buf[r.off:])
		r.off += c
		n += c
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// fill encodes what comes next (the header and a row, a row, or the
// trailer) into the emptied buffer; false when all was read.
func (r *copyReader) fill() bool {
	r.buf, r.off = r.buf[:0], 0
	if !r.started {
		r.started = true
		r.buf = append(r.buf, copyHeader...)
	}
	switch {
	case r.next < len(r.states):
		r.buf = appendRow(r.buf, &r.states[r.next].Entry)
		r.next++
	case !r.ended:
		r.ended = true
		r.buf = binary.BigEndian.AppendUint16(r.buf, 0xffff)
	default:
		return false
	}
	return true
}

// appendRow appends one entry's task state to dst as a row of COPY's binary
// format, in the order of columns.
func appendRow(b []byte, e *Entry) []byte {
	t := &e.Task
	updated := t.UpdatedAt
	if updated.IsZero() {
		updated = time.Now()
	}
	var lease, completeBy time.Time
	switch t.Status {
	case store.Running:
		lease = t.LeaseUntil
	case store.Waiting:
		completeBy = t.CompleteBy
	}
	s := t.Settings
	b = binary.BigEndian.AppendUint16(b, uint16(len(columns)))
	b = appendRaw(b, t.ID[:])
	b = appendInt4(b, e.Partition)
	b = appendInt8(b, e.Offset)
	b = appendRaw(b, t.Namespace)
	b = appendRaw(b, t.Action)
	b = appendRaw(b, string(t.Status))
	b = appendInt4(b, t.Priority)
	// The payload column is NOT NULL: a state without one sends it empty.
	b = appendRaw(b, t.Payload)
	b = appendNullBytes(b, t.Result)
	b = appendRaw(b, t.Outcome)
	b = appendRaw(b, t.Error)
	b = appendBool(b, t.TimedOut)
	b = appendRaw(b, t.ErrorCode)
	b = appendRaw(b, t.IdempotencyKey)
	b = appendInt4(b, t.Attempt)
	b = appendInt4(b, s.MaxAttempts)
	b = appendInt8(b, s.Timeout.Milliseconds())
	b = appendRaw(b, string(s.Backoff.Kind))
	b = appendInt8(b, s.Backoff.Initial.Milliseconds())
	b = appendInt8(b, s.Backoff.Max.Milliseconds())
	b = appendFloat8(b, s.Backoff.Multiplier)
	b = appendRaw(b, t.WorkerID)
	b = appendJSONB(b, t.TraceContext)
	b = appendRaw(b, t.Origin)
	b = appendTime(b, t.CreatedAt)
	b = appendTime(b, t.RunAt)
	b = appendNullTime(b, t.StartedAt)
	b = appendNullTime(b, t.FinishedAt)
	b = appendTime(b, updated)
	b = appendNullTime(b, lease)
	b = appendNullBytes(b, t.CompletionSecret)
	return appendNullTime(b, completeBy)
}

// appendNull appends a NULL field.
func appendNull(b []byte) []byte { return binary.BigEndian.AppendUint32(b, math.MaxUint32) }

// appendRaw appends a field of v's bytes as they are: bytea, uuid's 16, or
// text, whose encoding the server checks.
func appendRaw[T ~string | ~[]byte](b []byte, v T) []byte {
	return append(binary.BigEndian.AppendUint32(b, uint32(len(v))), v...)
}

// appendNullBytes is appendRaw with nil as NULL.
func appendNullBytes(b, v []byte) []byte {
	if v == nil {
		return appendNull(b)
	}
	return appendRaw(b, v)
}

func appendInt4(b []byte, v int32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(b, 4), uint32(v))
}

func appendInt8(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(b, 8), uint64(v))
}

func appendFloat8(b []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(b, 8), math.Float64bits(v))
}

func appendBool(b []byte, v bool) []byte {
	b = binary.BigEndian.AppendUint32(b, 1)
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// postgresEpoch is where timestamptz counts its microseconds from.
var postgresEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Unix() * 1_000_000

// appendTime appends a timestamptz: microseconds since 2000 (truncated, as
// pgx does).
func appendTime(b []byte, v time.Time) []byte {
	micros := v.Unix()*1_000_000 + int64(v.Nanosecond())/1000
	return appendInt8(b, micros-postgresEpoch)
}

// appendNullTime is appendTime with the zero time as NULL.
func appendNullTime(b []byte, v time.Time) []byte {
	if v.IsZero() {
		return appendNull(b)
	}
	return appendTime(b, v)
}

// appendJSONB appends a trace context as jsonb (a version byte, then the
// text), and an empty one as NULL.
func appendJSONB(b []byte, tc map[string]string) []byte {
	if len(tc) == 0 {
		return appendNull(b)
	}
	at := len(b)
	b = append(binary.BigEndian.AppendUint32(b, 0), 1)
	b = appendTraceJSON(b, tc)
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	return b
}

// appendTraceJSON appends a trace context as a JSON object. W3C trace
// headers are printable ASCII, which JSON takes as it is: they are written
// without encoding/json's reflection over the map (a per cent of a loaded
// process), in the map's order, which jsonb does not keep anyway. Any other
// text goes through encoding/json.
func appendTraceJSON(b []byte, tc map[string]string) []byte {
	for k, v := range tc {
		if !plainJSON(k) || !plainJSON(v) {
			// A map of strings always encodes.
			j, _ := json.Marshal(tc)
			return append(b, j...)
		}
	}
	b = append(b, '{')
	first := true
	for k, v := range tc {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(append(append(append(append(b, '"'), k...), `":"`...), v...), '"')
	}
	return append(b, '}')
}

// plainJSON reports whether s is a JSON string's content as it is: printable
// ASCII without quotes or backslashes.
func plainJSON(s string) bool {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
