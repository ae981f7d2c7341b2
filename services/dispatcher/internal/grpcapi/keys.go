package grpcapi

import (
	"context"

	"github.com/razorbill/flo/libs/millis"
	"github.com/razorbill/flo/libs/page"
	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// CreateKey makes an API key and returns it with its secret, shown only here.
func (s *Server) CreateKey(ctx context.Context, req *flov1.CreateKeyRequest) (*flov1.CreateKeyResponse, error) {
	k, secret, err := s.d.Keys.Create(ctx, req.GetNamespace(), req.GetRole(), millis.Duration(req.GetTtlMs()))
	if err != nil {
		return nil, err
	}
	return &flov1.CreateKeyResponse{Key: keyProto(k), Secret: secret}, nil
}

// ListKeys lists API keys by id.
func (s *Server) ListKeys(ctx context.Context, req *flov1.ListKeysRequest) (*flov1.ListKeysResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 1)
	if err != nil {
		return nil, err
	}
	ks, next, err := s.d.Keys.List(ctx, req.GetNamespace(), p)
	if err != nil {
		return nil, err
	}
	out := &flov1.ListKeysResponse{Keys: make([]*flov1.ApiKey, len(ks)), NextPageToken: next}
	for i, k := range ks {
		out.Keys[i] = keyProto(k)
	}
	return out, nil
}

// RevokeKey revokes an API key.
func (s *Server) RevokeKey(ctx context.Context, req *flov1.RevokeKeyRequest) (*flov1.ApiKey, error) {
	k, err := s.d.Keys.Revoke(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return keyProto(k), nil
}

// GetKeyForAuth reads a key with its secret's hash, for the gateway's check.
func (s *Server) GetKeyForAuth(ctx context.Context, req *dispatcherv1.GetKeyForAuthRequest) (*dispatcherv1.KeyForAuth, error) {
	k, err := s.d.Keys.Get(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &dispatcherv1.KeyForAuth{
		Id: k.ID, Namespace: k.Namespace, Role: k.Role, SecretHash: k.SecretHash,
		ExpiresAt: timestamp(k.ExpiresAt), RevokedAt: timestamp(k.RevokedAt),
	}, nil
}

func keyProto(k store.APIKey) *flov1.ApiKey {
	return &flov1.ApiKey{
		Id: k.ID, Namespace: k.Namespace, Role: k.Role, CreatedAt: timestamp(k.CreatedAt),
		ExpiresAt: timestamp(k.ExpiresAt), RevokedAt: timestamp(k.RevokedAt),
	}
}
