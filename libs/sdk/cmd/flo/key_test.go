package main

import (
	"strings"
	"testing"
	"time"

	flo "github.com/razorbill/flo-go"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// createdKey is the output of `flo key create`.
type createdKey struct {
	Key    flo.Key `json:"key"`
	Secret string  `json:"secret"`
}

// TestKeysEndToEnd makes, uses, lists and revokes keys with the CLI and the SDK against a whole
// stack whose gateway checks keys: a revoked key is refused within the gateway's key cache TTL.
func TestKeysEndToEnd(t *testing.T) {
	s := startWorkflowStack(t)
	ctx := t.Context()

	code, stdout, stderr := s.cli(t, "key", "create", "--role", "client", "--expires", "30d")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "will not be shown again")
	client := decode[createdKey](t, stdout)
	require.Equal(t, "myapp", client.Key.Namespace)
	require.Equal(t, flo.RoleClient, client.Key.Role)
	require.Regexp(t, `^flo_`+client.Key.ID+`_[0-9a-f]{64}$`, client.Secret)
	require.Equal(t, 30*24*time.Hour, client.Key.ExpiresAt.Sub(client.Key.CreatedAt))
	require.True(t, client.Key.RevokedAt.IsZero())

	// Without --namespace an admin key has none, and a list shows every namespace's keys.
	code, stdout, stderr = runCLI(t, "--addr", s.addr, "key", "create", "--role", "admin")
	require.Equal(t, 0, code, stderr)
	admin := decode[createdKey](t, stdout)
	require.Empty(t, admin.Key.Namespace)
	ids := func(keys []*flo.Key) []string {
		out := make([]string, len(keys))
		for i, k := range keys {
			out[i] = k.ID
		}
		return out
	}
	inMyapp := ids(decode[[]*flo.Key](t, s.ok(t, "key", "list")))
	require.Contains(t, inMyapp, client.Key.ID)
	require.NotContains(t, inMyapp, admin.Key.ID)
	code, stdout, stderr = runCLI(t, "--addr", s.addr, "key", "list")
	require.Equal(t, 0, code, stderr)
	require.Subset(t, ids(decode[[]*flo.Key](t, stdout)), []string{client.Key.ID, admin.Key.ID})

	// The new keys work: the client key in its namespace, the admin key for keys.
	code, _, stderr = s.cli(t, "--token", client.Secret, "action", "list")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = runCLI(t, "--addr", s.addr, "--token", admin.Secret, "key", "list")
	require.Equal(t, 0, code, stderr)
	// A client key may not manage keys.
	code, _, stderr = s.cli(t, "--token", client.Secret, "key", "list")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "PermissionDenied")

	// The SDK: a read key made in code, its client working until the key is revoked.
	reader, secret, err := s.client.CreateKey(ctx, "myapp", flo.RoleRead, time.Hour)
	require.NoError(t, err)
	require.Equal(t, time.Hour, reader.ExpiresAt.Sub(reader.CreatedAt))
	listed, err := s.client.ListKeys(ctx, "myapp")
	require.NoError(t, err)
	require.Contains(t, ids(listed), reader.ID)
	rc := flo.NewClient(s.addr, flo.WithNamespace("myapp"), flo.WithToken(secret))
	require.NoError(t, rc.Connect())
	t.Cleanup(func() { _ = rc.Close() })
	_, err = rc.ListWorkers(ctx)
	require.NoError(t, err)
	_, _, err = s.client.CreateKey(ctx, "myapp", "owner", 0)
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)

	revoked, err := s.client.RevokeKey(ctx, reader.ID)
	require.NoError(t, err)
	require.False(t, revoked.RevokedAt.IsZero())
	again, err := s.client.RevokeKey(ctx, reader.ID)
	require.NoError(t, err)
	require.Equal(t, revoked.RevokedAt, again.RevokedAt)
	require.Eventually(t, func() bool {
		_, err := rc.ListWorkers(ctx)
		return status.Code(err) == codes.Unauthenticated
	}, 10*time.Second, 50*time.Millisecond, "a revoked key is refused within the key cache TTL")

	// The CLI's revoke, and the revoked client key refused.
	out := decode[flo.Key](t, s.ok(t, "key", "revoke", client.Key.ID))
	require.False(t, out.RevokedAt.IsZero())
	require.Eventually(t, func() bool {
		code, _, stderr := s.cli(t, "--token", client.Secret, "action", "list")
		return code == 1 && strings.Contains(stderr, "Unauthenticated")
	}, 10*time.Second, 50*time.Millisecond)
}
