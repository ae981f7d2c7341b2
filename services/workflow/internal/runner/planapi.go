package runner

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/workflow/internal/catalog"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/plan"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// PlanReport is one plan of a workflow version and its executors' state on
// this replica.
type PlanReport struct {
	Plan *definition.Plan
	// Executors are in the order the definition lists them.
	Executors []plan.ExecutorStatus
}

// PlanStatus reports the plans of version of a workflow (the latest when
// version is empty), in definition order, with each executor's health,
// breaker and recent attempts as this replica holds them in memory; replica
// is this replica's host name, so a caller can tell which one answered. An
// unknown workflow or version is NotFound.
func (r *Runner) PlanStatus(ctx context.Context, namespace, workflow, version string) (replica string, plans []PlanReport, err error) {
	if version == "" {
		w, err := r.catalog.Get(ctx, namespace, workflow, "")
		if err != nil {
			return "", nil, err
		}
		version = w.Version
	}
	if err := text.Name("namespace", namespace); err != nil {
		return "", nil, err
	}
	if err := text.Name("workflow", workflow); err != nil {
		return "", nil, err
	}
	// Versions never change, so the parsed definition is usually cached and
	// this reads nothing.
	k := store.VersionKey{Namespace: namespace, Name: workflow, Version: version}
	defs, err := r.catalog.Definitions(ctx, r.pool, []store.VersionKey{k})
	if err != nil {
		return "", nil, fmt.Errorf("read workflow %s version %s: %w", workflow, version, err)
	}
	def, ok := defs[k]
	if !ok {
		return "", nil, catalog.NotFound(workflow, version)
	}
	for _, p := range inOrder(def.Plans) {
		ref := engine.PlanRef{Namespace: namespace, Workflow: workflow, Plan: p.Name}
		plans = append(plans, PlanReport{Plan: p, Executors: r.plans.Status(ref, p)})
	}
	return hostname(), plans, nil
}

// inOrder returns plans as the definition writes them: by position, then
// by name.
func inOrder(plans map[string]*definition.Plan) []*definition.Plan {
	out := slices.Collect(maps.Values(plans))
	slices.SortFunc(out, func(a, b *definition.Plan) int {
		return cmp.Or(cmp.Compare(a.Pos.Line, b.Pos.Line), cmp.Compare(a.Pos.Column, b.Pos.Column), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// InvalidatePlanCache removes the namespace's cached plan outcomes whose
// invalidate_on list names event, only the one stored under key when key is
// not empty, and returns how many it removed. Events follow the signal type
// rule, as invalidate_on entries do.
func (r *Runner) InvalidatePlanCache(ctx context.Context, namespace, event, key string) (int64, error) {
	if namespace == "" {
		return 0, fault.Invalidf("namespace is required")
	}
	if err := text.SignalType("event", event); err != nil {
		return 0, err
	}
	if err := text.Storable("key", key); err != nil {
		return 0, err
	}
	n, err := store.InvalidatePlanCache(ctx, r.pool, namespace, event, key)
	if err != nil {
		return 0, fmt.Errorf("invalidate plan cache on %s: %w", event, err)
	}
	return n, nil
}

// hostname names this replica; a host without a name still answers, as
// "unknown", since the plans matter more than the label.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return h
}
