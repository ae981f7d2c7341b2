// Package auth is the gateway's edge check: it authenticates the API key of
// every public call (or the admin token), decides from one table keyed by
// gRPC method whether the key's role may make the call in the call's
// namespace, and limits each key's rate. The same Guard serves gRPC (unary
// and stream interceptors) and REST (an HTTP middleware for authentication,
// content type and rate, and a grpc-gateway middleware for authorization).
package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Role is what a key may do.
type Role string

// The roles. Admin acts in every namespace and manages namespaces and keys;
// the others act in one namespace.
const (
	RoleAdmin  Role = "admin"
	RoleClient Role = "client"
	RoleWorker Role = "worker"
	RoleRead   Role = "read"
)

// Principal is who makes a call: the key's id, role and namespace ("" for
// admin).
type Principal struct {
	KeyID     string
	Role      Role
	Namespace string
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal the Guard put in ctx. A call without
// one was not authenticated; callers must treat that as no rights.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// StoredKey is what the key store keeps of a key: never the secret, only
// its SHA-256.
type StoredKey struct {
	ID         string
	Namespace  string
	Role       Role
	SecretHash []byte
	// ExpiresAt is zero for a key that does not expire.
	ExpiresAt time.Time
	Revoked   bool
}

// ErrKeyNotFound is what a KeyLookup returns for an id it does not know.
var ErrKeyNotFound = errors.New("key not found")

// KeyLookup reads a key by id from the store (the dispatcher). It returns
// ErrKeyNotFound for an unknown id; any other error is a failure to ask.
type KeyLookup func(ctx context.Context, id string) (StoredKey, error)

// Config is the auth part of the gateway's configuration.
type Config struct {
	// AdminToken is a bearer token that acts as an admin key (key id
	// "admin"); the first admin key of a new installation.
	AdminToken string `env:"FLO_ADMIN_TOKEN"`
	// KeyCacheTTL is how long a looked-up key is reused, so how long a
	// revoke takes to reach every gateway.
	KeyCacheTTL time.Duration `env:"FLO_AUTH_KEY_CACHE_TTL, default=2s"`
	// Rate limits in calls per second per key (burst twice that); 0 is
	// unlimited.
	RateClient float64 `env:"FLO_RATE_LIMIT_CLIENT, default=10000"`
	RateWorker float64 `env:"FLO_RATE_LIMIT_WORKER, default=10000"`
	RateRead   float64 `env:"FLO_RATE_LIMIT_READ, default=1000"`
	RateAdmin  float64 `env:"FLO_RATE_LIMIT_ADMIN, default=0"`
}

// Rates returns the per-role rates of c.
func (c Config) Rates() map[Role]float64 {
	return map[Role]float64{
		RoleClient: c.RateClient,
		RoleWorker: c.RateWorker,
		RoleRead:   c.RateRead,
		RoleAdmin:  c.RateAdmin,
	}
}

// Options configure a Guard.
type Options struct {
	// AdminToken acts as an admin key; empty means there is none.
	AdminToken string
	// Lookup reads keys; required unless Off.
	Lookup KeyLookup
	// CacheTTL is how long a lookup's answer is reused; 0 means 2 s.
	CacheTTL time.Duration
	// Rates are calls per second per key of each role; a missing or zero
	// rate is unlimited.
	Rates map[Role]float64
	// Off turns checks off: every call is an anonymous admin.
	Off bool
	// Log receives lookup failures.
	Log *slog.Logger
	// Now is the clock, for tests; nil means time.Now.
	Now func() time.Time
}

// Options returns the Guard options of c for a gateway whose keys come from
// lookup; off is config.Auth.Off().
func (c Config) Options(lookup KeyLookup, off bool, log *slog.Logger) Options {
	return Options{AdminToken: c.AdminToken, Lookup: lookup, CacheTTL: c.KeyCacheTTL, Rates: c.Rates(), Off: off, Log: log}
}

const defaultCacheTTL = 2 * time.Second

// Guard checks public calls. It is safe for concurrent use.
type Guard struct {
	off    bool
	authn  *authenticator
	limits *limiter
	routes map[route]operation
}

// anonymous is every caller's principal while auth is off, so no code path
// ever treats a missing principal as allowed.
var anonymous = Principal{KeyID: "anonymous", Role: RoleAdmin}

// New returns a Guard. Without Off it needs an admin token and a lookup.
func New(opts Options) (*Guard, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CacheTTL <= 0 {
		opts.CacheTTL = defaultCacheTTL
	}
	if !opts.Off {
		if opts.AdminToken == "" {
			return nil, errors.New("auth: an admin token is required unless auth is off (set FLO_ADMIN_TOKEN, or FLO_AUTH=off)")
		}
		if opts.Lookup == nil {
			return nil, errors.New("auth: a key lookup is required unless auth is off")
		}
	}
	routes, err := restRoutes()
	if err != nil {
		return nil, fmt.Errorf("auth: map REST routes: %w", err)
	}
	return &Guard{
		off:    opts.Off,
		authn:  newAuthenticator(opts.AdminToken, opts.Lookup, opts.CacheTTL, opts.Now, opts.Log),
		limits: newLimiter(opts.Rates, opts.Now),
		routes: routes,
	}, nil
}
