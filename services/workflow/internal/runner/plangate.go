package runner

import (
	"context"
	"encoding/json"
	"time"

	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/plan"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// planGate answers a unit's plan steps: order, breakers and health from the
// replica's registry; rate limits and the cache from Postgres, in the unit's
// transaction, so a slot taken by an advance that rolls back is given back.
// The engine cannot take an error, so the first one is kept and the unit
// discards the advance and fails with it (see unit.advance).
type planGate struct {
	ctx context.Context
	db  store.DB
	reg *plan.Registry
	err error
}

func (g *planGate) Order(ref engine.PlanRef, p *definition.Plan) []string {
	return g.reg.Order(ref, p, random)
}

func (g *planGate) Admit(ref engine.PlanRef, p *definition.Plan, ex *definition.Executor, now time.Time) engine.Admission {
	if adm := g.reg.Breaker(ref, p, ex); adm.Skip != engine.SkipNone {
		return adm
	}
	if ex.RateLimit == nil || g.err != nil {
		return engine.Admission{}
	}
	ok, retryAt, detail, err := store.TakeRate(g.ctx, g.db, ref, ex.Name, ex.RateLimit, now)
	if err != nil {
		g.err = err
		return engine.Admission{}
	}
	if !ok {
		return engine.Admission{Skip: engine.SkipRateLimited, Detail: detail, RetryAt: retryAt}
	}
	return engine.Admission{}
}

func (g *planGate) Cached(ref engine.PlanRef, key string, now time.Time) (json.RawMessage, bool) {
	if g.err != nil {
		return nil, false
	}
	out, ok, err := store.CachedOutput(g.ctx, g.db, ref, key, now)
	if err != nil {
		g.err = err
		return nil, false
	}
	return out, ok
}
