package flo

import (
	"context"
	"fmt"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Roles of an API key. An admin key acts in every namespace and manages namespaces and keys;
// a client key invokes, starts, signals, cancels and reads in its namespace; a worker key runs
// workers (the worker stream, registration, heartbeats, stream reads and acks); a read key only
// gets and lists.
const (
	RoleAdmin  = "admin"
	RoleClient = "client"
	RoleWorker = "worker"
	RoleRead   = "read"
)

// Key is an API key as the server lists it: everything but its secret, which is shown only by
// [Client.CreateKey].
type Key struct {
	ID string `json:"id"`
	// Namespace is the namespace the key acts in; empty for an admin key.
	Namespace string    `json:"namespace,omitempty"`
	Role      string    `json:"role"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	// ExpiresAt is zero for a key that does not expire.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// RevokedAt is zero while the key is not revoked.
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

func (c *Client) keyService() (flov1.KeyServiceClient, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	return flov1.NewKeyServiceClient(conn), nil
}

// CreateKey makes an API key of role in namespace (empty for [RoleAdmin]) that expires after ttl,
// or never when ttl is zero (at most ten years). It returns the key and its secret, the whole
// `flo_<id>_<secret>` text to pass to [WithToken] or FLO_TOKEN; the server keeps only a hash of
// it, so it cannot be shown again. The client's own namespace setting is not involved. Only an
// admin key may create keys.
func (c *Client) CreateKey(ctx context.Context, namespace, role string, ttl time.Duration) (key *Key, secret string, err error) {
	svc, err := c.keyService()
	if err != nil {
		return nil, "", err
	}
	resp, err := svc.CreateKey(ctx, &flov1.CreateKeyRequest{Namespace: namespace, Role: role, TtlMs: ttl.Milliseconds()})
	if err != nil {
		return nil, "", fmt.Errorf("create %s key: %w", role, err)
	}
	return keyFromProto(resp.GetKey()), resp.GetSecret(), nil
}

// ListKeys returns the keys of namespace by id, or every key when namespace is empty, revoked
// and expired ones included. Only an admin key may list keys.
func (c *Client) ListKeys(ctx context.Context, namespace string) ([]*Key, error) {
	svc, err := c.keyService()
	if err != nil {
		return nil, err
	}
	return listPages(0, func(size int32, token string) ([]*flov1.ApiKey, string, error) {
		resp, err := svc.ListKeys(ctx, &flov1.ListKeysRequest{Namespace: namespace, Limit: size, PageToken: token})
		if err != nil {
			return nil, "", fmt.Errorf("list keys: %w", err)
		}
		return resp.GetKeys(), resp.GetNextPageToken(), nil
	}, keyFromProto)
}

// RevokeKey revokes the key id; revoking a revoked key returns it unchanged. Gateways refuse
// the key within a few seconds (their key cache's TTL, 2 s by default). Only an admin key may
// revoke keys.
func (c *Client) RevokeKey(ctx context.Context, id string) (*Key, error) {
	svc, err := c.keyService()
	if err != nil {
		return nil, err
	}
	k, err := svc.RevokeKey(ctx, &flov1.RevokeKeyRequest{Id: id})
	if err != nil {
		return nil, fmt.Errorf("revoke key %s: %w", id, err)
	}
	return keyFromProto(k), nil
}

func keyFromProto(k *flov1.ApiKey) *Key {
	return &Key{
		ID: k.GetId(), Namespace: k.GetNamespace(), Role: k.GetRole(), CreatedAt: timeFromProto(k.GetCreatedAt()),
		ExpiresAt: timeFromProto(k.GetExpiresAt()), RevokedAt: timeFromProto(k.GetRevokedAt()),
	}
}
