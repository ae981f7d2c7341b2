// Package text holds the rules every service applies to the text a client or
// worker sends, so that nothing Postgres cannot store (invalid UTF-8, NUL)
// and nothing unbounded reaches a shared transaction. There is one function
// per rule: identifiers (Name, StreamName, WorkerID, SignalType) and keys (Key) are refused with a
// fault.Invalid error naming the field, since a changed identifier would name
// something else; free text (Clean) is repaired and truncated instead, since
// refusing a worker's error message would fail the report it rides in; for
// the same reason a worker's invalid error code is dropped (CleanFailure).
package text

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/razorbill/flo/libs/fault"
)

// Limits of the rules.
const (
	// MaxNameBytes bounds a name: namespaces, actions, workflows.
	MaxNameBytes = 128
	// MaxWorkerIDBytes bounds a worker id and a stream consumer name.
	MaxWorkerIDBytes = 128
	// MaxVersionBytes bounds a workflow version.
	MaxVersionBytes = 64
	// MaxSignalTypeBytes bounds a workflow signal type.
	MaxSignalTypeBytes = 128
	// MaxErrorCodeBytes bounds a failed task's error code.
	MaxErrorCodeBytes = 64
	// MaxKeyBytes bounds an idempotency key.
	MaxKeyBytes = 256
	// MaxFreeBytes bounds free text: task errors, nack reasons, cancel
	// reasons. Longer text is cut to this size, marker included.
	MaxFreeBytes = 16 << 10
	// MaxOutcomeBytes bounds a completed task's outcome, which workflows
	// match against transition names of at most MaxNameBytes.
	MaxOutcomeBytes = 256
)

// identifier is one identifier rule: at most max bytes of ASCII letters and
// digits and the punctuation it allows (first, as the first byte; rest,
// after it), and how the error describes it. A byte loop, not a regular
// expression: every task's action and namespace pass through it at intake.
type identifier struct {
	max         int
	first, rest string
	form        string
}

func (r identifier) check(field, s string) error {
	if s == "" {
		return fault.Invalidf("%s is required", field)
	}
	if !r.valid(s) {
		return fault.Invalidf("%s %q is invalid: use %s", field, s, r.form)
	}
	return nil
}

func (r identifier) valid(s string) bool {
	if len(s) > r.max {
		return false
	}
	allowed := r.first
	for i := range len(s) {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(allowed, c) >= 0 {
			allowed = r.rest
			continue
		}
		return false
	}
	return true
}

var (
	// names exclude "/" so a namespace and a name joined by a slash name one
	// thing unambiguously.
	names = identifier{MaxNameBytes, "", "._-",
		"1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit"}
	// streamNames, for streams and consumer groups, also allow a leading '_'.
	streamNames = identifier{MaxNameBytes, "_", "._-",
		"1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'"}
	// workerIDs also exclude "/", which joins namespace and id in record
	// keys, and allow ':' for host:pid style ids.
	workerIDs = identifier{MaxWorkerIDBytes, "", "._:-",
		"1 to 128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"}
	versions = identifier{MaxVersionBytes, "", "._+-",
		"1 to 64 letters, digits, '.', '_', '+' or '-', starting with a letter or digit"}
	signalTypes = identifier{MaxSignalTypeBytes, "_", "_.:-",
		"1 to 128 letters, digits, '_', '.', ':' or '-', not starting with '.', ':' or '-'"}
	errorCodes = identifier{MaxErrorCodeBytes, "_", "_.:-",
		"1 to 64 letters, digits, '_', '.', ':' or '-', not starting with '.', ':' or '-'"}
)

// Name checks a namespace, action or workflow name: 1 to MaxNameBytes
// letters, digits, '.', '_' or '-', starting with a letter or digit.
func Name(field, s string) error { return names.check(field, s) }

// StreamName checks a stream or consumer group name: 1 to MaxNameBytes
// letters, digits, '.', '_' or '-', not starting with '.' or '-'.
func StreamName(field, s string) error { return streamNames.check(field, s) }

// WorkerID checks a worker id or consumer name: 1 to MaxWorkerIDBytes
// letters, digits, '.', '_', ':' or '-', starting with a letter or digit.
func WorkerID(field, s string) error { return workerIDs.check(field, s) }

// Version checks a workflow version: 1 to MaxVersionBytes letters, digits,
// '.', '_', '+' or '-', starting with a letter or digit.
func Version(field, s string) error { return versions.check(field, s) }

// SignalType checks a workflow signal type: 1 to MaxSignalTypeBytes letters,
// digits, '_', '.', ':' or '-', not starting with '.', ':' or '-'.
func SignalType(field, s string) error { return signalTypes.check(field, s) }

// ErrorCode checks a failed task's error code ("card_declined"): 1 to
// MaxErrorCodeBytes letters, digits, '_', '.', ':' or '-', not starting with
// '.', ':' or '-'.
func ErrorCode(field, s string) error { return errorCodes.check(field, s) }

// CleanFailure returns a worker's failure as the server records it: its
// message cleaned as Clean does, and its error code kept when it is empty or
// follows ErrorCode. An invalid code is dropped with a note in the message,
// not refused: refusing it would fail the report and leave the task running
// until its lease expired, while the failure itself is what the user needs.
func CleanFailure(msg, code string) (string, string) {
	if code != "" {
		if err := ErrorCode("error code", code); err != nil {
			msg, code = msg+" [dropped: "+err.Error()+"]", ""
		}
	}
	return Clean(msg, MaxFreeBytes), code
}

// Key checks an idempotency key, which may be empty: valid UTF-8 without NUL,
// at most MaxKeyBytes bytes.
func Key(field, s string) error {
	if len(s) > MaxKeyBytes {
		return fault.Invalidf("%s is %d bytes, at most %d", field, len(s), MaxKeyBytes)
	}
	return Storable(field, s)
}

// Storable checks that s is text Postgres can store: valid UTF-8 without NUL.
// It is the rule for identifiers whose shape another rule does not fix.
func Storable(field, s string) error {
	if !utf8.ValidString(s) {
		return fault.Invalidf("%s is not valid UTF-8", field)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return fault.Invalidf("%s must not contain NUL characters", field)
	}
	return nil
}

// Clean returns free text as Postgres can store it and at most limit bytes
// long: invalid UTF-8 becomes U+FFFD, NUL becomes U+FFFD, and text longer than
// limit is cut at a character boundary and ends with a marker saying how many
// bytes were dropped. A limit too small to hold the marker cuts without one.
func Clean(s string, limit int) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return truncate(s, limit)
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	return truncate(strings.ReplaceAll(s, "\x00", "\uFFFD"), limit)
}

func truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	// The marker's digits depend on the cut; the count printed is at most
	// len(s), so sizing it for that keeps the result within limit.
	room := limit - len(marker(len(s)))
	if room < 0 {
		return s[:cutPoint(s, limit)]
	}
	cut := cutPoint(s, room)
	return s[:cut] + marker(len(s)-cut)
}

func marker(dropped int) string { return fmt.Sprintf("…[truncated %d bytes]", dropped) }

// cutPoint returns the largest index at most n that starts a character.
func cutPoint(s string, n int) int {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}
