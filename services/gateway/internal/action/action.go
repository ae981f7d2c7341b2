// Package action decides whether an action may be invoked. Every invocation
// needs that answer, so it is cached for a short time: a burst of invocations
// costs one dispatcher round trip per action per TTL, and a change made through
// another gateway replica (disable, enable) is seen within that TTL. When the
// dispatcher cannot answer (it is restarting), an expired answer is used
// rather than failing: invocations travel on the log and do not need the
// dispatcher to be up.
package action

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// ErrNotFound reports an action the namespace does not know.
var ErrNotFound = errors.New("action not found")

// ErrDisabled reports an action that exists but is disabled.
var ErrDisabled = errors.New("action is disabled")

// LookupFunc asks the source of truth about an action. It returns an error
// wrapping ErrNotFound for an unknown action.
type LookupFunc func(ctx context.Context, namespace, name string) (enabled bool, err error)

// lookupTimeout bounds a shared lookup, which runs detached from any one
// caller's context so that one caller giving up does not fail the others.
const lookupTimeout = 10 * time.Second

// sweepAt is the number of entries above which expired entries are dropped
// on insert, keeping the map bounded by the actions in active use; below it
// expired entries stay as the fallback for a dispatcher that cannot answer.
const sweepAt = 4096

type entry struct {
	enabled bool
	expires time.Time
}

// Cache remembers for a TTL whether actions exist and are enabled. Unknown
// actions are not remembered, so an action registered anywhere is invocable
// at once.
type Cache struct {
	lookup LookupFunc
	ttl    time.Duration
	now    func() time.Time

	group singleflight.Group

	mu      sync.Mutex
	entries map[string]entry
}

// NewCache returns a Cache whose answers live for ttl.
func NewCache(lookup LookupFunc, ttl time.Duration) *Cache {
	return &Cache{lookup: lookup, ttl: ttl, now: time.Now, entries: make(map[string]entry)}
}

// CheckInvocable returns nil when the action exists and is enabled, an error
// wrapping ErrNotFound or ErrDisabled when it is not, and the lookup's error
// when that could not be decided.
func (c *Cache) CheckInvocable(ctx context.Context, namespace, name string) error {
	key := namespace + "\x00" + name
	enabled, err := c.enabled(ctx, key, namespace, name)
	if err != nil {
		return err
	}
	if !enabled {
		return fmt.Errorf("action %q: %w", name, ErrDisabled)
	}
	return nil
}

func (c *Cache) enabled(ctx context.Context, key, namespace, name string) (bool, error) {
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	if ok && c.now().Before(e.expires) {
		return e.enabled, nil
	}
	ch := c.group.DoChan(key, func() (any, error) {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
		defer cancel()
		enabled, err := c.lookup(lctx, namespace, name)
		if err != nil {
			if ok && !errors.Is(err, ErrNotFound) {
				return e.enabled, nil
			}
			return false, fmt.Errorf("look up action %q: %w", name, err)
		}
		c.store(key, enabled)
		return enabled, nil
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return false, res.Err
		}
		return res.Val.(bool), nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (c *Cache) store(key string, enabled bool) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= sweepAt {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
	}
	c.entries[key] = entry{enabled: enabled, expires: now.Add(c.ttl)}
}

// Forget drops what is cached about an action, so the next check asks again.
// The gateway calls it after changing the action itself.
func (c *Cache) Forget(namespace, name string) {
	c.mu.Lock()
	delete(c.entries, namespace+"\x00"+name)
	c.mu.Unlock()
}
