// Package catalog manages namespaces and actions: validation, defaults,
// persistence, and an in-memory cache of action settings that the hot paths
// (command intake and claims) read without a database round trip.
package catalog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// cacheTTL bounds how stale a cached action may be when a change notification
// from another replica was missed; notifications normally invalidate at once.
const cacheTTL = 30 * time.Second

// cacheLimit bounds the cache; past it the cache starts over.
const cacheLimit = 10000

// DefaultMaxActions is how many actions a namespace may hold unless
// FLO_MAX_ACTIONS_PER_NAMESPACE says otherwise.
const DefaultMaxActions = 10000

// Catalog is the namespaces-and-actions domain.
type Catalog struct {
	pool       *pgxpool.Pool
	now        func() time.Time
	maxActions int

	mu      sync.Mutex
	actions map[string]cachedAction
	// gen counts invalidations, so a lookup that raced one does not cache
	// what it read before the change.
	gen        uint64
	namespaces map[string]bool
}

// cachedAction holds a looked-up action; found=false caches its absence.
type cachedAction struct {
	action   store.Action
	found    bool
	loadedAt time.Time
}

// New returns a Catalog on pool that admits at most maxActions actions per
// namespace (DefaultMaxActions when zero).
func New(pool *pgxpool.Pool, maxActions int) *Catalog {
	return &Catalog{pool: pool, now: time.Now, maxActions: cmp.Or(maxActions, DefaultMaxActions),
		actions: map[string]cachedAction{}, namespaces: map[string]bool{}}
}

// Bootstrap creates the given namespaces if they are missing.
func (c *Catalog) Bootstrap(ctx context.Context, names []string) error {
	if err := validateNames("namespace", names); err != nil {
		return err
	}
	if len(names) == 0 {
		return nil
	}
	if err := store.CreateNamespaces(ctx, c.pool, names); err != nil {
		return fmt.Errorf("bootstrap namespaces: %w", err)
	}
	return nil
}

// CreateNamespace creates a namespace, or returns it when it already exists.
func (c *Catalog) CreateNamespace(ctx context.Context, name string) (store.Namespace, error) {
	if err := text.Name("name", name); err != nil {
		return store.Namespace{}, err
	}
	if err := store.CreateNamespaces(ctx, c.pool, []string{name}); err != nil {
		return store.Namespace{}, fmt.Errorf("create namespace %s: %w", name, err)
	}
	return c.GetNamespace(ctx, name)
}

// GetNamespace reads a namespace.
func (c *Catalog) GetNamespace(ctx context.Context, name string) (store.Namespace, error) {
	if err := text.Name("name", name); err != nil {
		return store.Namespace{}, err
	}
	n, err := store.GetNamespace(ctx, c.pool, name)
	if errors.Is(err, pg.ErrNotFound) {
		return store.Namespace{}, notFoundNamespace(name)
	}
	return n, err
}

// ListNamespaces lists a page of namespaces by name, with the token of the
// next page.
func (c *Catalog) ListNamespaces(ctx context.Context, p page.Page) ([]store.Namespace, string, error) {
	ns, err := store.ListNamespaces(ctx, c.pool, p.Part(0), p.Fetch())
	if err != nil {
		return nil, "", err
	}
	ns, next := page.Cut(p, ns, func(n store.Namespace) []string { return []string{n.Name} })
	return ns, next, nil
}

// CheckNamespace returns a NotFound error unless the namespace exists.
// Namespaces are never deleted, so a positive answer is cached for good.
func (c *Catalog) CheckNamespace(ctx context.Context, name string) error {
	return c.checkNamespace(ctx, c.pool, name)
}

func (c *Catalog) checkNamespace(ctx context.Context, db store.DB, name string) error {
	if err := text.Name("namespace", name); err != nil {
		return err
	}
	c.mu.Lock()
	known := c.namespaces[name]
	c.mu.Unlock()
	if known {
		return nil
	}
	if _, err := store.GetNamespace(ctx, db, name); err != nil {
		if errors.Is(err, pg.ErrNotFound) {
			return notFoundNamespace(name)
		}
		return err
	}
	c.mu.Lock()
	c.namespaces[name] = true
	c.mu.Unlock()
	return nil
}

// Register creates an action or replaces its settings.
func (c *Catalog) Register(ctx context.Context, namespace, name string, spec Spec) (store.Action, error) {
	if err := text.Name("namespace", namespace); err != nil {
		return store.Action{}, err
	}
	if err := text.Name("name", name); err != nil {
		return store.Action{}, err
	}
	settings, err := spec.Settings()
	if err != nil {
		return store.Action{}, err
	}
	var a store.Action
	err = pg.InTx(ctx, c.pool, func(tx pgx.Tx) error {
		if err := c.checkNamespace(ctx, tx, namespace); err != nil {
			return err
		}
		if err := c.admit(ctx, tx, namespace, []string{name}); err != nil {
			return err
		}
		var err error
		if a, err = store.UpsertAction(ctx, tx, namespace, name, settings); err != nil {
			return err
		}
		return store.Notify(ctx, tx, store.ActionsChannel, []string{store.Key(namespace, name)})
	})
	if err != nil {
		return store.Action{}, fmt.Errorf("register action %s: %w", store.Key(namespace, name), err)
	}
	c.Invalidate(store.Key(namespace, name))
	return a, nil
}

// Ensure makes the named actions known with default settings, leaving
// existing ones unchanged, and returns all of them in the order named.
func (c *Catalog) Ensure(ctx context.Context, namespace string, names []string) ([]store.Action, error) {
	if err := text.Name("namespace", namespace); err != nil {
		return nil, err
	}
	if err := validateNames("names", names); err != nil {
		return nil, err
	}
	names = unique(names)
	var all []store.Action
	err := pg.InTx(ctx, c.pool, func(tx pgx.Tx) error {
		if err := c.checkNamespace(ctx, tx, namespace); err != nil {
			return err
		}
		if err := c.admit(ctx, tx, namespace, names); err != nil {
			return err
		}
		created, err := store.EnsureActions(ctx, tx, namespace, names, DefaultSettings())
		if err != nil {
			return err
		}
		keys := make([]string, len(created))
		for i, a := range created {
			keys[i] = store.Key(a.Namespace, a.Name)
		}
		if err := store.Notify(ctx, tx, store.ActionsChannel, keys); err != nil {
			return err
		}
		namespaces := make([]string, len(names))
		for i := range names {
			namespaces[i] = namespace
		}
		all, err = store.LookupActions(ctx, tx, namespaces, names)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("ensure actions in %s: %w", namespace, err)
	}
	byName := make(map[string]store.Action, len(all))
	for _, a := range all {
		byName[a.Name] = a
		c.Invalidate(store.Key(a.Namespace, a.Name))
	}
	out := make([]store.Action, 0, len(names))
	for _, n := range names {
		out = append(out, byName[n])
	}
	return out, nil
}

// admit refuses names (distinct) that would take namespace past its action
// limit; names that exist already take no room. A call that adds actions
// locks the namespace's actions until tx ends, so registrations racing for
// the last places cannot both get one; one that only names existing actions
// (a worker connecting, a settings change) takes no lock, since actions are
// never deleted.
func (c *Catalog) admit(ctx context.Context, tx pgx.Tx, namespace string, names []string) error {
	existing, err := store.CountExistingActions(ctx, tx, namespace, names)
	if err != nil || existing == len(names) {
		return err
	}
	if err := pg.LockXact(ctx, tx, "flo.dispatcher.actions/"+namespace); err != nil {
		return err
	}
	// Counted again under the lock: a racing call may have added some.
	if existing, err = store.CountExistingActions(ctx, tx, namespace, names); err != nil {
		return err
	}
	total, err := store.CountActions(ctx, tx, namespace)
	if err != nil {
		return err
	}
	if added := len(names) - existing; added > 0 && total+added > c.maxActions {
		return fault.Exhaustedf("namespace %s has %d actions, the limit is %d (FLO_MAX_ACTIONS_PER_NAMESPACE)", namespace, total, c.maxActions)
	}
	return nil
}

// Get reads one action.
func (c *Catalog) Get(ctx context.Context, namespace, name string) (store.Action, error) {
	if err := c.CheckNamespace(ctx, namespace); err != nil {
		return store.Action{}, err
	}
	if err := text.Name("name", name); err != nil {
		return store.Action{}, err
	}
	a, err := store.GetAction(ctx, c.pool, namespace, name)
	if errors.Is(err, pg.ErrNotFound) {
		return store.Action{}, notFoundAction(namespace, name)
	}
	return a, err
}

// List returns a page of a namespace's actions by name, with the token of
// the next page.
func (c *Catalog) List(ctx context.Context, namespace string, p page.Page) ([]store.Action, string, error) {
	if err := c.CheckNamespace(ctx, namespace); err != nil {
		return nil, "", err
	}
	as, err := store.ListActions(ctx, c.pool, namespace, p.Part(0), p.Fetch())
	if err != nil {
		return nil, "", err
	}
	as, next := page.Cut(p, as, func(a store.Action) []string { return []string{a.Name} })
	return as, next, nil
}

// SetEnabled enables or disables an action. A disabled action's queued tasks
// stay queued and are not handed to workers until it is enabled again.
func (c *Catalog) SetEnabled(ctx context.Context, namespace, name string, enabled bool) (store.Action, error) {
	if err := c.CheckNamespace(ctx, namespace); err != nil {
		return store.Action{}, err
	}
	if err := text.Name("name", name); err != nil {
		return store.Action{}, err
	}
	var a store.Action
	err := pg.InTx(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		if a, err = store.SetActionEnabled(ctx, tx, namespace, name, enabled); err != nil {
			return err
		}
		return store.Notify(ctx, tx, store.ActionsChannel, []string{store.Key(namespace, name)})
	})
	if errors.Is(err, pg.ErrNotFound) {
		return store.Action{}, notFoundAction(namespace, name)
	}
	if err != nil {
		return store.Action{}, fmt.Errorf("set action %s enabled=%t: %w", store.Key(namespace, name), enabled, err)
	}
	c.Invalidate(store.Key(namespace, name))
	return a, nil
}

// Ref names one action.
type Ref struct {
	Namespace string
	Action    string
}

// Lookup returns the existing actions among refs keyed by store.Key, from the
// cache where possible and otherwise with one query on db (which may be the
// caller's transaction).
func (c *Catalog) Lookup(ctx context.Context, db store.DB, refs []Ref) (map[string]store.Action, error) {
	out := make(map[string]store.Action, len(refs))
	var missNS, missNames []string
	seen := make(map[string]bool, len(refs))
	now := c.now()
	c.mu.Lock()
	gen := c.gen
	for _, r := range refs {
		k := store.Key(r.Namespace, r.Action)
		if seen[k] {
			continue
		}
		seen[k] = true
		e, ok := c.actions[k]
		switch {
		case ok && now.Sub(e.loadedAt) < cacheTTL:
			if e.found {
				out[k] = e.action
			}
		default:
			missNS = append(missNS, r.Namespace)
			missNames = append(missNames, r.Action)
		}
	}
	c.mu.Unlock()
	if len(missNS) == 0 {
		return out, nil
	}
	found, err := store.LookupActions(ctx, db, missNS, missNames)
	if err != nil {
		// Postgres away: answers past their TTL are better than none, so
		// tasks keep moving through an outage (changes made meanwhile show
		// once it is back).
		if stale, ok := c.stale(missNS, missNames); ok {
			for k, a := range stale {
				out[k] = a
			}
			return out, nil
		}
		return nil, err
	}
	for _, a := range found {
		out[store.Key(a.Namespace, a.Name)] = a
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return out, nil
	}
	if len(c.actions)+len(missNS) > cacheLimit {
		c.actions = map[string]cachedAction{}
	}
	for i := range missNS {
		c.actions[store.Key(missNS[i], missNames[i])] = cachedAction{loadedAt: now}
	}
	for _, a := range found {
		c.actions[store.Key(a.Namespace, a.Name)] = cachedAction{action: a, found: true, loadedAt: now}
	}
	return out, nil
}

// stale returns the cached actions among refs whatever their age, and
// whether every one of them is cached.
func (c *Catalog) stale(namespaces, names []string) (map[string]store.Action, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]store.Action, len(names))
	for i := range names {
		k := store.Key(namespaces[i], names[i])
		e, ok := c.actions[k]
		if !ok {
			return nil, false
		}
		if e.found {
			out[k] = e.action
		}
	}
	return out, true
}

// Claimable returns the actions among names that exist and are enabled: the
// ones whose tasks may be handed to workers.
func (c *Catalog) Claimable(ctx context.Context, namespace string, names []string) ([]string, error) {
	refs := make([]Ref, len(names))
	for i, n := range names {
		refs[i] = Ref{Namespace: namespace, Action: n}
	}
	found, err := c.Lookup(ctx, c.pool, refs)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(names))
	for _, n := range unique(names) {
		if a, ok := found[store.Key(namespace, n)]; ok && a.Enabled {
			out = append(out, n)
		}
	}
	return out, nil
}

// Invalidate drops one cached action; the next lookup reads it again.
func (c *Catalog) Invalidate(key string) {
	c.mu.Lock()
	delete(c.actions, key)
	c.gen++
	c.mu.Unlock()
}

// Forget drops every cached action, for when change notifications may have
// been missed (the listener reconnected).
func (c *Catalog) Forget() {
	c.mu.Lock()
	c.actions = map[string]cachedAction{}
	c.gen++
	c.mu.Unlock()
}

func unique(names []string) []string {
	seen := make(map[string]bool, len(names))
	out := names[:0:0]
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}
