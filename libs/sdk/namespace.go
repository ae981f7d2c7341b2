package flo

import (
	"context"
	"fmt"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Namespace is an isolation unit: actions, tasks and workers all live in exactly one.
type Namespace struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at,omitzero"`
}

// CreateNamespace creates the namespace name. The client's own namespace setting is not
// involved, so a client bound to "default" can create "myapp".
func (c *Client) CreateNamespace(ctx context.Context, name string) (*Namespace, error) {
	svc, err := c.namespaceService()
	if err != nil {
		return nil, err
	}
	ns, err := svc.CreateNamespace(ctx, &flov1.CreateNamespaceRequest{Name: name})
	if err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	return namespaceFromProto(ns), nil
}

// GetNamespace returns the namespace name.
func (c *Client) GetNamespace(ctx context.Context, name string) (*Namespace, error) {
	svc, err := c.namespaceService()
	if err != nil {
		return nil, err
	}
	ns, err := svc.GetNamespace(ctx, &flov1.GetNamespaceRequest{Name: name})
	if err != nil {
		return nil, fmt.Errorf("get namespace %s: %w", name, err)
	}
	return namespaceFromProto(ns), nil
}

// ListNamespaces returns every namespace.
func (c *Client) ListNamespaces(ctx context.Context) ([]*Namespace, error) {
	svc, err := c.namespaceService()
	if err != nil {
		return nil, err
	}
	return listPages(0, func(size int32, token string) ([]*flov1.Namespace, string, error) {
		resp, err := svc.ListNamespaces(ctx, &flov1.ListNamespacesRequest{Limit: size, PageToken: token})
		if err != nil {
			return nil, "", fmt.Errorf("list namespaces: %w", err)
		}
		return resp.GetNamespaces(), resp.GetNextPageToken(), nil
	}, namespaceFromProto)
}

func namespaceFromProto(ns *flov1.Namespace) *Namespace {
	return &Namespace{Name: ns.GetName(), CreatedAt: timeFromProto(ns.GetCreatedAt())}
}
