package catalog

import (
	"context"

	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// Triggered is an enabled workflow's latest version with its stream trigger.
type Triggered struct {
	store.VersionKey
	Trigger *definition.Trigger
}

// Triggers lists the stream triggers that run now: those of the latest
// version of every enabled workflow. Only versions whose YAML mentions
// trigger are parsed, once, and cached, so listing again costs one query.
func (c *Catalog) Triggers(ctx context.Context) ([]Triggered, error) {
	keys, err := store.TriggerCandidates(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	defs, err := c.Definitions(ctx, c.pool, keys)
	if err != nil {
		return nil, err
	}
	var out []Triggered
	for _, k := range keys {
		if d := defs[k]; d != nil && d.Trigger != nil {
			out = append(out, Triggered{VersionKey: k, Trigger: d.Trigger})
		}
	}
	return out, nil
}
