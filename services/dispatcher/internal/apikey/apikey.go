// Package apikey makes, lists and revokes API keys, and reads a key for the
// gateway to check. The dispatcher owns them because it owns namespaces, the
// scope of every key but an admin's. It never sees a key's secret after
// Create: only keyformat.Hash of it is stored.
package apikey

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/keyformat"
	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// Roles a key may have.
const (
	Admin  = "admin"
	Client = "client"
	Worker = "worker"
	Read   = "read"
)

// MaxTTL is the longest lifetime a key may be given.
const MaxTTL = 10 * 365 * 24 * time.Hour

// Namespaces answers whether a namespace exists (catalog.Catalog does).
type Namespaces interface {
	CheckNamespace(ctx context.Context, name string) error
}

// Keys is the API key domain.
type Keys struct {
	pool       *pgxpool.Pool
	namespaces Namespaces
}

// New returns Keys on pool, checking namespaces with ns.
func New(pool *pgxpool.Pool, ns Namespaces) *Keys {
	return &Keys{pool: pool, namespaces: ns}
}

// Create makes a key of role in namespace (empty for admin) that expires
// after ttl, or never when ttl is zero. It returns the stored key and the
// whole key text, which is not kept anywhere.
func (k *Keys) Create(ctx context.Context, namespace, role string, ttl time.Duration) (store.APIKey, string, error) {
	if err := k.checkScope(ctx, namespace, role); err != nil {
		return store.APIKey{}, "", err
	}
	if ttl < 0 || ttl > MaxTTL {
		return store.APIKey{}, "", fault.Invalidf("ttl_ms must be between 0 (no expiry) and %d (ten years), got %d", MaxTTL.Milliseconds(), ttl.Milliseconds())
	}
	gen, err := keyformat.Generate()
	if err != nil {
		return store.APIKey{}, "", fmt.Errorf("generate key: %w", err)
	}
	key, err := store.InsertKey(ctx, k.pool, gen.ID, namespace, role, keyformat.Hash(gen.Secret), ttl)
	if err != nil {
		return store.APIKey{}, "", fmt.Errorf("create %s key: %w", role, err)
	}
	return key, gen.String(), nil
}

func (k *Keys) checkScope(ctx context.Context, namespace, role string) error {
	switch role {
	case Admin:
		if namespace != "" {
			return fault.Invalidf("an admin key acts in every namespace: namespace must be empty, got %q", namespace)
		}
		return nil
	case Client, Worker, Read:
		if namespace == "" {
			return fault.Invalidf("a %s key needs a namespace", role)
		}
		return k.namespaces.CheckNamespace(ctx, namespace)
	}
	return fault.Invalidf("role must be one of admin, client, worker, read; got %q", role)
}

// List returns a page of keys by id, only namespace's when it is not empty,
// with the token of the next page.
func (k *Keys) List(ctx context.Context, namespace string, p page.Page) ([]store.APIKey, string, error) {
	if namespace != "" {
		if err := k.namespaces.CheckNamespace(ctx, namespace); err != nil {
			return nil, "", err
		}
	}
	after := p.Part(0)
	if after != "" && !keyformat.ValidID(after) {
		return nil, "", page.BadToken()
	}
	keys, err := store.ListKeys(ctx, k.pool, namespace, after, p.Fetch())
	if err != nil {
		return nil, "", err
	}
	keys, next := page.Cut(p, keys, func(key store.APIKey) []string { return []string{key.ID} })
	return keys, next, nil
}

// Revoke stops a key from authenticating. Revoking a revoked key returns it
// with its first revocation time.
func (k *Keys) Revoke(ctx context.Context, id string) (store.APIKey, error) {
	return k.byID(ctx, id, store.RevokeKey)
}

// Get reads a key, its secret's hash included, for a gateway to check.
// Expiry and revocation are the caller's to judge: the key is returned
// either way.
func (k *Keys) Get(ctx context.Context, id string) (store.APIKey, error) {
	return k.byID(ctx, id, store.GetKey)
}

// byID runs a statement on one key, with the id checked and a missing key
// NotFound.
func (k *Keys) byID(ctx context.Context, id string, stmt func(context.Context, store.DB, string) (store.APIKey, error)) (store.APIKey, error) {
	if !keyformat.ValidID(id) {
		return store.APIKey{}, fault.Invalidf("id must be a key id (12 characters a-z, 2-7), got %q", id)
	}
	key, err := stmt(ctx, k.pool, id)
	if errors.Is(err, pg.ErrNotFound) {
		return store.APIKey{}, fault.NotFoundf("key %s not found", id)
	}
	return key, err
}
