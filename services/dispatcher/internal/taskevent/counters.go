package taskevent

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// counterSpecs name the counter each event type adds to. Every task state
// change goes through a Builder, so counting what the builders collected
// counts every change exactly once, after its transaction committed.
var counterSpecs = map[Type]struct{ name, desc string }{
	Created:        {"flo.tasks.invoked", "Tasks created from invocations; an invocation of a task that already exists is not counted again."},
	Started:        {"flo.tasks.claimed", "Task attempts handed to workers."},
	Completed:      {"flo.tasks.completed", "Tasks completed."},
	Failed:         {"flo.tasks.failed", "Tasks failed for good: a non-retryable error, FailTask, or no result by the async deadline."},
	RetryScheduled: {"flo.tasks.retried", "Failed or nacked attempts scheduled to run again."},
	DeadLettered:   {"flo.tasks.dead_lettered", "Tasks moved to the dead letters: attempts used up, a failure without retry, or the last attempt's lease expired."},
	Abandoned:      {"flo.tasks.abandoned", "Attempts handed back by workers without counting."},
	LeaseExpired:   {"flo.tasks.leases.expired", "Leases that ran out because their worker went silent."},
	Waiting:        {"flo.tasks.waiting", "Attempts whose handler answered that the result comes later, by completion token."},
	Rejected:       {"flo.tasks.rejected", "Invocations of unknown or disabled actions, answered with a REJECTED event."},
}

// tally is what one counter increment is about.
type tally struct {
	typ               Type
	namespace, action string
	reason            string
}

func (t tally) attributes() metric.MeasurementOption {
	if t.typ == Rejected {
		return metric.WithAttributes(attribute.String("reason", t.reason))
	}
	return metric.WithAttributes(attribute.String("namespace", t.namespace), attribute.String("action", t.action))
}

// Counters are the flo.tasks.* counters of task state changes.
type Counters struct {
	byType map[Type]metric.Int64Counter
}

// NewCounters creates the counters on meter (several components may create
// them; the meter hands each the same instruments).
func NewCounters(meter metric.Meter) (*Counters, error) {
	c := &Counters{byType: make(map[Type]metric.Int64Counter, len(counterSpecs))}
	for typ, spec := range counterSpecs {
		counter, err := meter.Int64Counter(spec.name, metric.WithUnit("{task}"), metric.WithDescription(spec.desc))
		if err != nil {
			return nil, fmt.Errorf("create metric %s: %w", spec.name, err)
		}
		c.byType[typ] = counter
	}
	return c, nil
}

// CountEvents adds n events of typ about tasks of namespace/action; for
// Rejected, outcome is the reason and the names are not recorded.
func (c *Counters) CountEvents(ctx context.Context, typ Type, namespace, action, outcome string, n int64) {
	counter, ok := c.byType[typ]
	if !ok {
		return
	}
	t := tally{typ: typ, namespace: namespace, action: action}
	if typ == Rejected {
		t = tally{typ: typ, reason: outcome}
	}
	counter.Add(ctx, n, t.attributes())
}
