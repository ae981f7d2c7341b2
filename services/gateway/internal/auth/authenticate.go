package auth

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/keyformat"
)

// maxCachedKeys bounds the key cache: unknown ids are cached too, so a
// caller sending random ids must not grow it without end.
const maxCachedKeys = 100_000

// adminKeyID is the key id of the admin token's principal.
const adminKeyID = "admin"

// lookupTimeout bounds one question to the key store.
const lookupTimeout = 5 * time.Second

// authenticator turns a bearer token into a principal. Looked-up keys
// (found or not) are reused for ttl, which bounds how long a revoke takes to
// be seen; when the store cannot be asked, an older answer is used rather
// than locking every caller out.
type authenticator struct {
	adminToken []byte
	lookup     KeyLookup
	ttl        time.Duration
	now        func() time.Time
	log        *slog.Logger

	mu    sync.Mutex
	cache map[string]cachedKey
	max   int // maxCachedKeys; smaller in tests
	// lookups makes concurrent misses of one id one lookup, so a busy key
	// whose entry just went stale costs the store one call, not one per
	// caller.
	lookups singleflight.Group
}

type cachedKey struct {
	key   StoredKey
	found bool
	at    time.Time
}

func newAuthenticator(adminToken string, lookup KeyLookup, ttl time.Duration, now func() time.Time, log *slog.Logger) *authenticator {
	return &authenticator{
		adminToken: []byte(adminToken),
		lookup:     lookup,
		ttl:        ttl,
		now:        now,
		log:        log,
		cache:      make(map[string]cachedKey),
		max:        maxCachedKeys,
	}
}

// authenticate returns the principal of bearer, or an Unauthenticated
// status (Unavailable when the key store cannot be asked).
func (a *authenticator) authenticate(ctx context.Context, bearer string) (Principal, error) {
	if bearer == "" {
		return Principal{}, status.Error(codes.Unauthenticated, "missing API key: send authorization: Bearer <key>")
	}
	if len(a.adminToken) > 0 && subtle.ConstantTimeCompare([]byte(bearer), a.adminToken) == 1 {
		return Principal{KeyID: adminKeyID, Role: RoleAdmin}, nil
	}
	k, err := keyformat.Parse(bearer)
	if err != nil {
		return Principal{}, status.Error(codes.Unauthenticated, "malformed API key")
	}
	stored, found, err := a.get(ctx, k.ID)
	if err != nil {
		return Principal{}, err
	}
	// An unknown id and a wrong secret get the same answer, so a caller
	// cannot learn which ids exist.
	if !found || subtle.ConstantTimeCompare(keyformat.Hash(k.Secret), stored.SecretHash) != 1 {
		return Principal{}, status.Error(codes.Unauthenticated, "unknown API key")
	}
	if stored.Revoked {
		return Principal{}, status.Errorf(codes.Unauthenticated, "API key %s is revoked", k.ID)
	}
	if !stored.ExpiresAt.IsZero() && !a.now().Before(stored.ExpiresAt) {
		return Principal{}, status.Errorf(codes.Unauthenticated, "API key %s expired at %s", k.ID, stored.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return Principal{KeyID: stored.ID, Role: stored.Role, Namespace: stored.Namespace}, nil
}

// get returns the key with id, from the cache while its answer is fresh.
func (a *authenticator) get(ctx context.Context, id string) (StoredKey, bool, error) {
	now := a.now()
	a.mu.Lock()
	c, cached := a.cache[id]
	a.mu.Unlock()
	if cached && now.Sub(c.at) < a.ttl {
		return c.key, c.found, nil
	}
	v, err, _ := a.lookups.Do(id, func() (any, error) {
		// Shared by every caller waiting on it, so no one caller's cancel
		// ends it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
		defer cancel()
		return a.lookup(ctx, id)
	})
	key, _ := v.(StoredKey)
	found := err == nil
	if err != nil && !errors.Is(err, ErrKeyNotFound) {
		if cached {
			a.log.WarnContext(ctx, "auth: key lookup failed, using the last answer", "key_id", id, "age", now.Sub(c.at), "error", err)
			return c.key, c.found, nil
		}
		a.log.WarnContext(ctx, "auth: key lookup failed", "key_id", id, "error", err)
		return StoredKey{}, false, status.Error(codes.Unavailable, "cannot check the API key now; retry")
	}
	a.remember(id, cachedKey{key: key, found: found, at: now})
	return key, found, nil
}

func (a *authenticator) remember(id string, c cachedKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.cache[id]; !ok && len(a.cache) >= a.max {
		a.evict(c.at)
	}
	a.cache[id] = c
}

// evict drops stale answers, or when all are fresh an arbitrary tenth of
// the cache (map order), so a full cache costs one sweep per many inserts.
func (a *authenticator) evict(now time.Time) {
	for id, c := range a.cache {
		if now.Sub(c.at) >= a.ttl {
			delete(a.cache, id)
		}
	}
	for id := range a.cache {
		if len(a.cache) < a.max*9/10 {
			return
		}
		delete(a.cache, id)
	}
}
