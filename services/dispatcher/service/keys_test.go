package service_test

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/razorbill/flo/libs/harness"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestAPIKeys creates, lists and revokes keys through the dispatcher's API
// and reads the table behind it: only a hash of each secret is stored.
func TestAPIKeys(t *testing.T) {
	t.Parallel()
	dbURL := harness.NewDatabase(t)
	r := startReplica(t, dbURL, harness.NewBroker(t).Addrs())
	e := &env{svc: r.svc, client: r.client}
	db, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close(t.Context()) })

	create := func(t *testing.T, ns, role string, ttl time.Duration) *flov1.CreateKeyResponse {
		t.Helper()
		resp, err := e.client.CreateKey(t.Context(), &flov1.CreateKeyRequest{Namespace: ns, Role: role, TtlMs: ttl.Milliseconds()})
		require.NoError(t, err)
		return resp
	}

	t.Run("secret shown once, hash stored", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		resp := create(t, ns, "client", 0)
		k := resp.GetKey()
		require.Regexp(t, `^[a-z2-7]{12}$`, k.GetId())
		require.Regexp(t, `^flo_`+k.GetId()+`_[0-9a-f]{64}$`, resp.GetSecret())
		require.Equal(t, ns, k.GetNamespace())
		require.Equal(t, "client", k.GetRole())
		require.NotNil(t, k.GetCreatedAt())
		require.Nil(t, k.GetExpiresAt())
		require.Nil(t, k.GetRevokedAt())
		secret := resp.GetSecret()[len("flo_")+12+1:]
		want := sha256.Sum256([]byte(secret))

		var row string
		var hash []byte
		require.NoError(t, db.QueryRow(t.Context(), `SELECT k::text, secret_hash FROM dispatcher.api_keys k WHERE id = $1`, k.GetId()).Scan(&row, &hash))
		require.Equal(t, want[:], hash)
		require.NotContains(t, row, secret)
		require.NotContains(t, row, secret[:16])

		auth, err := e.client.GetKeyForAuth(t.Context(), &dispatcherv1.GetKeyForAuthRequest{Id: k.GetId()})
		require.NoError(t, err)
		require.Equal(t, want[:], auth.GetSecretHash())
		require.Equal(t, ns, auth.GetNamespace())
		require.Equal(t, "client", auth.GetRole())
		require.Nil(t, auth.GetExpiresAt())
		require.Nil(t, auth.GetRevokedAt())

		admin := create(t, "", "admin", 0)
		require.Empty(t, admin.GetKey().GetNamespace())
		require.NotEqual(t, k.GetId(), admin.GetKey().GetId())
	})

	t.Run("expiry", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		k := create(t, ns, "read", time.Millisecond).GetKey()
		require.Equal(t, k.GetCreatedAt().AsTime().Add(time.Millisecond), k.GetExpiresAt().AsTime())
		auth, err := e.client.GetKeyForAuth(t.Context(), &dispatcherv1.GetKeyForAuthRequest{Id: k.GetId()})
		require.NoError(t, err)
		require.Equal(t, k.GetExpiresAt().AsTime(), auth.GetExpiresAt().AsTime(), "the gateway judges expiry from this")
		long := create(t, ns, "worker", 30*24*time.Hour).GetKey()
		require.Equal(t, long.GetCreatedAt().AsTime().Add(30*24*time.Hour), long.GetExpiresAt().AsTime())
	})

	t.Run("list pages", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		other := e.namespace(t)
		made := map[string]bool{}
		for _, role := range []string{"client", "worker", "read", "client", "read"} {
			made[create(t, ns, role, 0).GetKey().GetId()] = true
		}
		create(t, other, "client", 0)
		got := map[string]bool{}
		var last string
		token := ""
		for pages := 1; ; pages++ {
			resp, err := e.client.ListKeys(t.Context(), &flov1.ListKeysRequest{Namespace: ns, Limit: 2, PageToken: token})
			require.NoError(t, err)
			require.LessOrEqual(t, len(resp.GetKeys()), 2)
			for _, k := range resp.GetKeys() {
				require.Equal(t, ns, k.GetNamespace())
				require.Greater(t, k.GetId(), last, "keys come by id")
				last = k.GetId()
				got[k.GetId()] = true
			}
			token = resp.GetNextPageToken()
			if token == "" {
				require.Equal(t, 3, pages)
				break
			}
		}
		require.Equal(t, made, got)

		all, err := e.client.ListKeys(t.Context(), &flov1.ListKeysRequest{Limit: 1000})
		require.NoError(t, err)
		namespaces := map[string]bool{}
		for _, k := range all.GetKeys() {
			namespaces[k.GetNamespace()] = true
		}
		require.True(t, namespaces[ns] && namespaces[other], "an unfiltered list holds every namespace's keys")

		_, err = e.client.ListKeys(t.Context(), &flov1.ListKeysRequest{Namespace: "nope"})
		requireCode(t, codes.NotFound, err, "namespace nope not found")
		_, err = e.client.ListKeys(t.Context(), &flov1.ListKeysRequest{PageToken: "garbage"})
		requireCode(t, codes.InvalidArgument, err, "page_token")
	})

	t.Run("revoke", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		k := create(t, ns, "worker", 0).GetKey()
		revoked, err := e.client.RevokeKey(t.Context(), &flov1.RevokeKeyRequest{Id: k.GetId()})
		require.NoError(t, err)
		require.NotNil(t, revoked.GetRevokedAt())
		require.Equal(t, k.GetId(), revoked.GetId())
		again, err := e.client.RevokeKey(t.Context(), &flov1.RevokeKeyRequest{Id: k.GetId()})
		require.NoError(t, err)
		require.Equal(t, revoked.GetRevokedAt().AsTime(), again.GetRevokedAt().AsTime(), "a second revoke keeps the first time")
		auth, err := e.client.GetKeyForAuth(t.Context(), &dispatcherv1.GetKeyForAuthRequest{Id: k.GetId()})
		require.NoError(t, err)
		require.Equal(t, revoked.GetRevokedAt().AsTime(), auth.GetRevokedAt().AsTime())
		listed, err := e.client.ListKeys(t.Context(), &flov1.ListKeysRequest{Namespace: ns})
		require.NoError(t, err)
		require.Len(t, listed.GetKeys(), 1)
		require.NotNil(t, listed.GetKeys()[0].GetRevokedAt(), "a revoked key stays listed")

		_, err = e.client.RevokeKey(t.Context(), &flov1.RevokeKeyRequest{Id: "aaaaaaaaaaaa"})
		requireCode(t, codes.NotFound, err, "key aaaaaaaaaaaa not found")
		_, err = e.client.GetKeyForAuth(t.Context(), &dispatcherv1.GetKeyForAuthRequest{Id: "aaaaaaaaaaaa"})
		requireCode(t, codes.NotFound, err, "key aaaaaaaaaaaa not found")
		_, err = e.client.RevokeKey(t.Context(), &flov1.RevokeKeyRequest{Id: "flo_" + k.GetId()})
		requireCode(t, codes.InvalidArgument, err, "id")
	})

	t.Run("bad requests", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		for _, tc := range []struct {
			name     string
			req      *flov1.CreateKeyRequest
			code     codes.Code
			contains string
		}{
			{"unknown role", &flov1.CreateKeyRequest{Namespace: ns, Role: "owner"}, codes.InvalidArgument, "role"},
			{"no role", &flov1.CreateKeyRequest{Namespace: ns}, codes.InvalidArgument, "role"},
			{"admin in a namespace", &flov1.CreateKeyRequest{Namespace: ns, Role: "admin"}, codes.InvalidArgument, "namespace must be empty"},
			{"client without namespace", &flov1.CreateKeyRequest{Role: "client"}, codes.InvalidArgument, "needs a namespace"},
			{"unknown namespace", &flov1.CreateKeyRequest{Namespace: "nope", Role: "read"}, codes.NotFound, "namespace nope not found"},
			{"malformed namespace", &flov1.CreateKeyRequest{Namespace: "a/b", Role: "read"}, codes.InvalidArgument, "namespace"},
			{"negative ttl", &flov1.CreateKeyRequest{Namespace: ns, Role: "read", TtlMs: -1}, codes.InvalidArgument, "ttl_ms"},
			{"ttl over ten years", &flov1.CreateKeyRequest{Namespace: ns, Role: "read", TtlMs: (3651 * 24 * time.Hour).Milliseconds()}, codes.InvalidArgument, "ttl_ms"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := e.client.CreateKey(t.Context(), tc.req)
				requireCode(t, tc.code, err, tc.contains)
			})
		}
		listed, err := e.client.ListKeys(t.Context(), &flov1.ListKeysRequest{Namespace: ns})
		require.NoError(t, err)
		require.Empty(t, listed.GetKeys(), "no refused request made a key")
	})
}
