// Package namespace checks that the namespace named by a call exists before the
// gateway acts on it. Namespaces are never deleted, so a positive answer from
// the dispatcher is remembered for the life of the process and most calls cost
// no round trip; negative answers are not remembered, so a namespace created
// through another replica is seen at once.
package namespace

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrNotFound reports a namespace the dispatcher does not know.
var ErrNotFound = errors.New("namespace not found")

// ErrEmpty reports a call that named no namespace.
var ErrEmpty = errors.New("namespace is required")

// LookupFunc asks the source of truth whether a namespace exists. It returns
// ErrNotFound (possibly wrapped) for an unknown namespace and any other error
// when it could not find out.
type LookupFunc func(ctx context.Context, name string) error

// Cache answers "does this namespace exist" from memory when it can.
type Cache struct {
	lookup LookupFunc

	mu    sync.RWMutex
	known map[string]struct{}
}

// NewCache returns a Cache that asks lookup about names it has not seen exist.
func NewCache(lookup LookupFunc) *Cache {
	return &Cache{lookup: lookup, known: make(map[string]struct{})}
}

// Check returns nil when the namespace exists, ErrEmpty for an empty name, an
// error wrapping ErrNotFound when it does not exist, and the lookup's error
// when that could not be decided.
func (c *Cache) Check(ctx context.Context, name string) error {
	if name == "" {
		return ErrEmpty
	}
	c.mu.RLock()
	_, ok := c.known[name]
	c.mu.RUnlock()
	if ok {
		return nil
	}
	if err := c.lookup(ctx, name); err != nil {
		return fmt.Errorf("look up namespace %q: %w", name, err)
	}
	c.Remember(name)
	return nil
}

// Remember records that a namespace exists, for example right after this
// gateway created it.
func (c *Cache) Remember(name string) {
	c.mu.Lock()
	c.known[name] = struct{}{}
	c.mu.Unlock()
}
