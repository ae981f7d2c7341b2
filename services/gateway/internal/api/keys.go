package api

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/services/gateway/internal/auth"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// KeyServer implements flov1.KeyServiceServer by passing each call to the
// dispatcher, which owns keys and validates them. Who may call it is the
// auth interceptor's decision (admin keys only), not this server's.
type KeyServer struct {
	flov1.UnimplementedKeyServiceServer

	dispatcher dispatcherv1.DispatcherClient
	log        *slog.Logger
}

// NewKeyServer returns a KeyServer backed by the dispatcher.
func NewKeyServer(d dispatcherv1.DispatcherClient, log *slog.Logger) *KeyServer {
	return &KeyServer{dispatcher: d, log: log}
}

// CreateKey makes a key; its secret is in the response and nowhere else.
func (s *KeyServer) CreateKey(ctx context.Context, req *flov1.CreateKeyRequest) (*flov1.CreateKeyResponse, error) {
	resp, err := s.dispatcher.CreateKey(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "create key", err)
	}
	return resp, nil
}

// ListKeys lists keys by id.
func (s *KeyServer) ListKeys(ctx context.Context, req *flov1.ListKeysRequest) (*flov1.ListKeysResponse, error) {
	resp, err := s.dispatcher.ListKeys(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "list keys", err)
	}
	return resp, nil
}

// RevokeKey revokes a key; gateways stop accepting it once their cached
// copy of it ends.
func (s *KeyServer) RevokeKey(ctx context.Context, req *flov1.RevokeKeyRequest) (*flov1.ApiKey, error) {
	key, err := s.dispatcher.RevokeKey(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "revoke key", err)
	}
	return key, nil
}

// KeyLookup returns the auth guard's key lookup, asking the dispatcher.
func KeyLookup(d dispatcherv1.DispatcherClient) auth.KeyLookup {
	return func(ctx context.Context, id string) (auth.StoredKey, error) {
		k, err := d.GetKeyForAuth(ctx, &dispatcherv1.GetKeyForAuthRequest{Id: id})
		if status.Code(err) == codes.NotFound {
			return auth.StoredKey{}, auth.ErrKeyNotFound
		}
		if err != nil {
			return auth.StoredKey{}, err
		}
		var expires time.Time
		if k.GetExpiresAt() != nil {
			expires = k.GetExpiresAt().AsTime()
		}
		return auth.StoredKey{
			ID: k.GetId(), Namespace: k.GetNamespace(), Role: auth.Role(k.GetRole()), SecretHash: k.GetSecretHash(),
			ExpiresAt: expires, Revoked: k.GetRevokedAt() != nil,
		}, nil
	}
}
