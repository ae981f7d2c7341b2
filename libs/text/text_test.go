package text_test

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/text"
)

func TestRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		check   func(field, s string) error
		in      string
		message string // empty: accepted
	}{
		{name: "name ok", check: text.Name, in: "billing.v2_x-y"},
		{name: "name empty", check: text.Name, in: "", message: "f is required"},
		{name: "name NUL", check: text.Name, in: "a\x00b", message: `f "a\x00b" is invalid`},
		{name: "name slash", check: text.Name, in: "a/b", message: "is invalid"},
		{name: "name too long", check: text.Name, in: strings.Repeat("a", 129), message: "is invalid"},
		{name: "stream name underscore", check: text.StreamName, in: "_audit.v1"},
		{name: "stream name dead-letter stream", check: text.StreamName, in: "events.dlq"},
		{name: "stream name longest", check: text.StreamName, in: strings.Repeat("s", 128)},
		{name: "stream name too long", check: text.StreamName, in: strings.Repeat("s", 129), message: "is invalid"},
		{name: "stream name slash", check: text.StreamName, in: "a/b", message: "is invalid"},
		{name: "stream name colon", check: text.StreamName, in: "a:b", message: "is invalid"},
		{name: "stream name empty", check: text.StreamName, in: "", message: "f is required"},
		{name: "stream name dash first", check: text.StreamName, in: "-x", message: "is invalid"},
		{name: "stream name NUL", check: text.StreamName, in: "s\x00", message: "is invalid"},
		{name: "worker id colon", check: text.WorkerID, in: "host:42"},
		{name: "worker id NUL", check: text.WorkerID, in: "w\x00", message: "is invalid"},
		{name: "worker id empty", check: text.WorkerID, in: "", message: "f is required"},
		{name: "version", check: text.Version, in: "1.0.0+build_2"},
		{name: "version NUL", check: text.Version, in: "1\x00", message: `f "1\x00" is invalid`},
		{name: "version too long", check: text.Version, in: strings.Repeat("1", 65), message: "is invalid"},
		{name: "signal type", check: text.SignalType, in: "_approved:v1"},
		{name: "signal type NUL", check: text.SignalType, in: "ok\x00", message: "is invalid"},
		{name: "signal type empty", check: text.SignalType, in: "", message: "f is required"},
		{name: "error code", check: text.ErrorCode, in: "card_declined"},
		{name: "error code dotted", check: text.ErrorCode, in: "_payments.v2:rate-limited"},
		{name: "error code space", check: text.ErrorCode, in: "card declined", message: "is invalid"},
		{name: "error code 65 bytes", check: text.ErrorCode, in: strings.Repeat("c", 65), message: "is invalid"},
		{name: "error code empty", check: text.ErrorCode, in: "", message: "f is required"},
		{name: "key empty", check: text.Key, in: ""},
		{name: "key any text", check: text.Key, in: "order 42 / é ✓"},
		{name: "key NUL", check: text.Key, in: "k\x00", message: "f must not contain NUL characters"},
		{name: "key invalid UTF-8", check: text.Key, in: "k\xff", message: "f is not valid UTF-8"},
		{name: "key 256 bytes", check: text.Key, in: strings.Repeat("k", 256)},
		{name: "key 257 bytes", check: text.Key, in: strings.Repeat("k", 257), message: "f is 257 bytes, at most 256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.check("f", tt.in)
			if tt.message == "" {
				require.NoError(t, err)
				return
			}
			kind, msg, ok := fault.KindOf(err)
			require.True(t, ok, "want a fault error, got %v", err)
			require.Equal(t, fault.Invalid, kind)
			require.Contains(t, msg, tt.message)
		})
	}
}

// Each identifier rule accepts exactly the strings of the pattern its
// error message describes, over random strings of the characters that
// matter (letters, digits, every punctuation any rule allows, '/', NUL, a
// space, a non-ASCII letter) around each rule's length limit.
func TestIdentifierRulesFollowTheirPatterns(t *testing.T) {
	t.Parallel()
	rules := []struct {
		check   func(field, s string) error
		pattern *regexp.Regexp
		max     int
	}{
		{text.Name, regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`), text.MaxNameBytes},
		{text.StreamName, regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`), text.MaxNameBytes},
		{text.WorkerID, regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`), text.MaxWorkerIDBytes},
		{text.Version, regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$`), text.MaxVersionBytes},
		{text.SignalType, regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$`), text.MaxSignalTypeBytes},
		{text.ErrorCode, regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$`), text.MaxErrorCodeBytes},
	}
	alphabet := []string{"a", "Z", "0", "9", ".", "_", "-", ":", "+", "/", "\x00", " ", "é", "`", "@", "[", "{"}
	r := rand.New(rand.NewPCG(1, 2))
	for i, rule := range rules {
		for range 5000 {
			n := r.IntN(5)
			if r.IntN(4) == 0 {
				n = rule.max - 2 + r.IntN(5)
			}
			var b strings.Builder
			for range n {
				if r.IntN(3) == 0 {
					b.WriteString(alphabet[r.IntN(len(alphabet))])
				} else {
					b.WriteByte("abcXYZ123"[r.IntN(9)])
				}
			}
			s := b.String()
			require.Equal(t, rule.pattern.MatchString(s), rule.check("f", s) == nil, "rule %d on %q", i, s)
		}
	}
}

func TestClean(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		in    string
		limit int
		want  string
	}{
		{name: "clean text unchanged", in: "boom: é", limit: 100, want: "boom: é"},
		{name: "NUL replaced", in: "a\x00b", limit: 100, want: "a\uFFFDb"},
		{name: "invalid UTF-8 replaced", in: "a\xffb", limit: 100, want: "a\uFFFDb"},
		{name: "cut with marker", in: strings.Repeat("x", 100), limit: 40, want: strings.Repeat("x", 16) + "…[truncated 84 bytes]"},
		{name: "limit below marker cuts bare", in: "abcdef", limit: 3, want: "abc"},
		{name: "cut on a character boundary", in: "ééééé", limit: 3, want: "é"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := text.Clean(tt.in, tt.limit)
			require.Equal(t, tt.want, got)
			require.LessOrEqual(t, len(got), tt.limit)
		})
	}
}

func TestCleanHugeText(t *testing.T) {
	t.Parallel()
	in := strings.Repeat("é\x00\xff", 1<<20)
	got := text.Clean(in, text.MaxFreeBytes)
	require.LessOrEqual(t, len(got), text.MaxFreeBytes)
	require.True(t, utf8.ValidString(got))
	require.NotContains(t, got, "\x00")
	require.Contains(t, got, "bytes]")
}

// A failure keeps a valid code or none; an invalid code is dropped and the
// message, cleaned, says so instead of the failure being refused.
func TestCleanFailure(t *testing.T) {
	t.Parallel()
	msg, code := text.CleanFailure("declined", "card_declined")
	require.Equal(t, "declined", msg)
	require.Equal(t, "card_declined", code)

	msg, code = text.CleanFailure("a\x00b", "")
	require.Equal(t, "a\uFFFDb", msg)
	require.Empty(t, code)

	msg, code = text.CleanFailure("declined", "card declined!")
	require.Empty(t, code)
	require.Equal(t, `declined [dropped: error code "card declined!" is invalid: use 1 to 64 letters, digits, '_', '.', ':' or '-', not starting with '.', ':' or '-']`, msg)

	msg, code = text.CleanFailure(strings.Repeat("x", 2*text.MaxFreeBytes), strings.Repeat("c", 100))
	require.Empty(t, code)
	require.LessOrEqual(t, len(msg), text.MaxFreeBytes)
}
