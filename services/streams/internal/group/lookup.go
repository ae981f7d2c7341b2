package group

import (
	"context"
	"errors"
	"sync"

	"github.com/razorbill/flo/services/streams/internal/store"
)

// maxKnownGroups bounds the groups a replica remembers for reads; past it
// the memory starts afresh.
const maxKnownGroups = 4096

// errGroupGone says a read found no cursors: the group it looked up was
// deleted since.
var errGroupGone = errors.New("group deleted")

// knownGroups remembers the groups that reads and settlements looked up, so
// they cost no lookup query. Streams and groups never change once created,
// and their ids are never reused. A read of a group deleted since finds no
// cursors (errGroupGone), a settlement finds the group missing, and either
// drops the entry and looks the name up again.
type knownGroups struct {
	mu sync.Mutex
	m  map[store.GroupKey]store.GroupOf
}

// lookup returns the group named k, remembered or from the catalog.
func (g *Groups) lookup(ctx context.Context, k store.GroupKey) (store.GroupOf, error) {
	kg := &g.known
	kg.mu.Lock()
	grp, ok := kg.m[k]
	kg.mu.Unlock()
	if ok {
		return grp, nil
	}
	grp, err := g.catalog.GetGroup(ctx, k)
	if err != nil {
		return store.GroupOf{}, err
	}
	g.remember(k, grp)
	return grp, nil
}

// remember keeps grp as the group named k.
func (g *Groups) remember(k store.GroupKey, grp store.GroupOf) {
	kg := &g.known
	kg.mu.Lock()
	defer kg.mu.Unlock()
	if kg.m == nil || len(kg.m) >= maxKnownGroups {
		kg.m = map[store.GroupKey]store.GroupOf{}
	}
	kg.m[k] = grp
}

// resolve returns the groups named by keys, remembered or looked up in one
// query; names that do not exist are missing from the result.
func (g *Groups) resolve(ctx context.Context, keys []store.GroupKey) (map[store.GroupKey]store.GroupOf, error) {
	out := make(map[store.GroupKey]store.GroupOf, len(keys))
	var unknown []store.GroupKey
	kg := &g.known
	kg.mu.Lock()
	for _, k := range keys {
		if grp, ok := kg.m[k]; ok {
			out[k] = grp
		} else {
			unknown = append(unknown, k)
		}
	}
	kg.mu.Unlock()
	if len(unknown) == 0 {
		return out, nil
	}
	found, err := store.ResolveGroups(ctx, g.pool, unknown)
	if err != nil {
		return nil, err
	}
	for k, grp := range found {
		out[k] = grp
		g.remember(k, grp)
	}
	return out, nil
}

// forget drops what lookup remembered of k.
func (g *Groups) forget(k store.GroupKey) {
	g.known.mu.Lock()
	delete(g.known.m, k)
	g.known.mu.Unlock()
}
