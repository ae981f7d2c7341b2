package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseExpiry(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{in: "", want: 0},
		{in: "30d", want: 30 * 24 * time.Hour},
		{in: "12h", want: 12 * time.Hour},
		{in: "90m", want: 90 * time.Minute},
		{in: "1h30m", want: 90 * time.Minute},
		{in: "3650d", want: 3650 * 24 * time.Hour},
		{in: "0d", err: "must be positive"},
		{in: "-2h", err: "must be positive"},
		{in: "99999999999d", err: "over ten years"},
		{in: "1.5d", err: "want a lifetime such as 30d"},
		{in: "d", err: "want a lifetime such as 30d"},
		{in: "soon", err: "want a lifetime such as 30d"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseExpiry(tc.in)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestKeyArgumentValidation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"create without role", []string{"key", "create", "--namespace", "myapp"}, `required flag(s) "role" not set`},
		{"create with bad expiry", []string{"key", "create", "--role", "client", "--expires", "forever"}, `--expires "forever"`},
		{"create with argument", []string{"key", "create", "extra", "--role", "read"}, `unknown command "extra"`},
		{"revoke without id", []string{"key", "revoke"}, "accepts 1 arg(s), received 0"},
		{"list with argument", []string{"key", "list", "x"}, `unknown command "x"`},
		{"unknown subcommand", []string{"key", "delete", "abc"}, `unknown command "delete" for "flo key"`},
		{"unreadable CA file", []string{"key", "list", "--ca-file", "/nonexistent/ca.pem"}, "read CA file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append(tc.args, "--addr", unreachable)...)
			require.Equal(t, 1, code)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.wantErr)
		})
	}
}
