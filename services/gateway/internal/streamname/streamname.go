// Package streamname checks the names of streams and consumer groups and the
// shape of record ids the way the streams service judges them, so the gateway
// refuses a bad one before a round trip and, on the worker stream, before it
// is merged into a coalesced call with good ones. Consumers are worker ids,
// checked by libs/text.
package streamname

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// MaxLen is the longest stream or group name.
const MaxLen = 128

// namePattern: 1–128 characters of [A-Za-z0-9._-], not starting with '.' or
// '-'.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// Check returns an error naming field when name is not a valid stream or
// group name.
func Check(field, name string) error {
	if name == "" {
		return fmt.Errorf("%s is required", field)
	}
	if !namePattern.MatchString(name) {
		return fmt.Errorf("%s %q is invalid: want 1 to %d letters, digits, '.', '_' or '-', not starting with '.' or '-'", field, name, MaxLen)
	}
	return nil
}

// CheckID returns an error when id is not a record id, "<ms>-<seq>" with
// both parts unsigned decimal integers.
func CheckID(id string) error {
	ms, seq, ok := strings.Cut(id, "-")
	if !ok || !isUint(ms) || !isUint(seq) {
		return fmt.Errorf("invalid record id %q: want <ms>-<seq>", id)
	}
	return nil
}

// isUint accepts what ParseUint does in base 10: digits only, no sign.
func isUint(s string) bool {
	_, err := strconv.ParseUint(s, 10, 64)
	return err == nil
}
