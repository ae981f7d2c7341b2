package runner

import (
	"context"

	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// setAttributes takes run's search attributes from its input as def
// declares them. An input giving one a value of the wrong type is an
// Invalid error naming the attribute; the run must not start.
func setAttributes(run *store.Run, def *definition.Definition) error {
	vals, err := def.SearchValues(run.Input)
	if err != nil {
		return err
	}
	run.Attributes = vals
	return nil
}

// fillAttributes gives the unit's new runs that were created without
// setAttributes (scheduled runs, whose input was checked against the
// attributes with the definition, E726) their attributes before they are
// written. An input that does not fit anyway leaves them out, logged: the
// run has started and nobody is there to refuse.
func (u *unit) fillAttributes(ctx context.Context) {
	for _, e := range u.order {
		if !e.isNew || e.def == nil || e.run.Attributes != nil {
			continue
		}
		if err := setAttributes(e.run, e.def); err != nil {
			u.r.log.ErrorContext(ctx, "run started without its search attributes", "run_id", e.run.ID, "error", err)
		}
	}
}
