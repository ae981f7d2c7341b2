package runner

import (
	"context"
	"slices"

	"github.com/razorbill/flo/services/workflow/internal/query"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// where parses and checks a ListRuns query (package query). Its attributes
// must be declared by a version of a workflow the listing is limited to —
// by the workflow filter or by the query itself — or, when it is limited
// to none, by any workflow of the namespace. An empty query is nil.
func (r *Runner) where(ctx context.Context, namespace, workflow, src string) (query.Expr, error) {
	e, err := query.Parse(src)
	if err != nil || e == nil {
		return nil, err
	}
	workflows, restricted := query.Workflows(e)
	switch {
	case workflow != "" && restricted:
		if !slices.Contains(workflows, workflow) {
			workflows = []string{}
		} else {
			workflows = []string{workflow}
		}
	case workflow != "":
		workflows = []string{workflow}
	case !restricted:
		workflows = nil
	}
	declared, err := store.DeclaredAttributes(ctx, r.pool, namespace, workflows)
	if err != nil {
		return nil, err
	}
	return query.Check(e, declared)
}
