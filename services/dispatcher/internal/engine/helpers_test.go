package engine_test

import (
	"bytes"
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

const ns = "acme"

// t0 is the tests' epoch.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// settings are the action settings the tests copy into tasks: 30 s timeout,
// three attempts, a constant 10 s backoff.
func settings(maxAttempts int32) *store.Settings {
	return &store.Settings{
		Timeout: 30 * time.Second, MaxAttempts: maxAttempts,
		Backoff: backoff.Policy{Kind: backoff.Constant, Initial: 10 * time.Second, Max: time.Minute, Multiplier: 2},
	}
}

func invocation(action string, priority int32) engine.Invocation {
	return engine.Invocation{
		TaskID: uuid.New(), Namespace: ns, Action: action, Payload: []byte(`{"n":1}`), Priority: priority,
		IdempotencyKey: "key", TraceContext: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		InvokedAt: t0,
	}
}

// invoke creates a task of action with maxAttempts and returns its id.
func invoke(t *testing.T, p *engine.Partition, action string, maxAttempts int32, now time.Time) uuid.UUID {
	t.Helper()
	inv := invocation(action, 0)
	changes := p.Invoke(nil, inv, settings(maxAttempts), "", now)
	require.Len(t, changes, 1)
	require.Equal(t, taskevent.Created, changes[0].Type)
	return inv.TaskID
}

// claimOne claims the best task of action for worker w and returns it.
func claimOne(t *testing.T, p *engine.Partition, action string, now time.Time) engine.Task {
	t.Helper()
	claimed, changes := p.Claim(ns, []string{action}, []engine.Slot{{WorkerID: "w1"}}, now)
	require.Len(t, claimed, 1)
	require.Len(t, changes, 1)
	require.Equal(t, taskevent.Started, changes[0].Type)
	return *claimed[0].Task
}

// running creates a task and claims it: attempt 1, running.
func running(t *testing.T, p *engine.Partition, maxAttempts int32, now time.Time) engine.Task {
	t.Helper()
	invoke(t, p, "send", maxAttempts, now)
	return claimOne(t, p, "send", now)
}

func types(changes []engine.Change) []taskevent.Type {
	out := make([]taskevent.Type, len(changes))
	for i, c := range changes {
		out[i] = c.Type
	}
	return out
}

func get(t *testing.T, p *engine.Partition, id uuid.UUID) engine.Task {
	t.Helper()
	task, ok := p.Get(id)
	require.True(t, ok, "task %s held", id)
	return task
}

// normal is a task as it reads back from the log: times in UTC without a
// monotonic reading, empty slices and maps nil.
func normal(t engine.Task) engine.Task {
	for _, tm := range []*time.Time{&t.CreatedAt, &t.RunAt, &t.StartedAt, &t.FinishedAt, &t.UpdatedAt, &t.LeaseUntil, &t.CompleteBy} {
		if !tm.IsZero() {
			*tm = tm.Round(0).UTC()
		}
	}
	for _, b := range []*[]byte{&t.Payload, &t.Result, &t.CompletionSecret} {
		if len(*b) == 0 {
			*b = nil
		}
	}
	if len(t.TraceContext) == 0 {
		t.TraceContext = nil
	}
	return t
}

// before says whether t comes before at in hand-out order.
func before(t engine.Task, at engine.Place) bool {
	return cmp.Or(cmp.Compare(at.Priority, t.Priority), t.RunAt.Compare(at.RunAt), t.CreatedAt.Compare(at.CreatedAt),
		bytes.Compare(t.ID[:], at.ID[:])) < 0
}

// readCold reads cold tasks back as view.LoadCold does, from view (each
// task's state as the view has it): the queued tasks not among w.Held, the
// ready ones in hand-out order, then the delayed ones soonest due, w.N at
// most; only the ready ones of its queue from w.From on, or before
// w.Before, for a read of one queue.
func readCold(view map[uuid.UUID]engine.Task, w *engine.Warming) []engine.Task {
	var ready, delayed []engine.Task
	one := w.OneQueue()
	for _, t := range view {
		if t.Status != store.Queued || slices.Contains(w.Held, t.ID) ||
			one && (t.Namespace != w.Namespace || t.Action != w.Action || t.RunAt.After(w.Now)) ||
			w.From != nil && before(t, *w.From) || w.Before != nil && !before(t, *w.Before) {
			continue
		}
		if t.RunAt.After(w.Now) {
			delayed = append(delayed, t)
		} else {
			ready = append(ready, t)
		}
	}
	slices.SortFunc(ready, func(a, b engine.Task) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.RunAt.Compare(b.RunAt), a.CreatedAt.Compare(b.CreatedAt),
			bytes.Compare(a.ID[:], b.ID[:]))
	})
	slices.SortFunc(delayed, func(a, b engine.Task) int {
		return cmp.Or(a.RunAt.Compare(b.RunAt), bytes.Compare(a.ID[:], b.ID[:]))
	})
	out := append(ready, delayed...)
	return out[:min(len(out), w.N)]
}
