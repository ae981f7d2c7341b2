// Package streamname checks the shape of record ids the way the streams
// service judges them, so the gateway refuses a bad one before a round trip
// and, on the worker stream, before it is merged into a coalesced call with
// good ones. Stream, group and consumer names follow libs/text's rules.
package streamname

import (
	"fmt"
	"strconv"
	"strings"
)

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
