package engine_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

func TestInvoke(t *testing.T) {
	t.Parallel()
	p := engine.New(3)
	inv := invocation("send", 5)
	inv.Origin, inv.MaxAttempts = "workflow", 1
	changes := p.Invoke(nil, inv, settings(3), "", t0)
	require.Equal(t, []taskevent.Type{taskevent.Created}, types(changes))
	task := get(t, p, inv.TaskID)
	require.Equal(t, changes[0].Task, task)
	require.Equal(t, store.Queued, task.Status)
	require.Equal(t, int32(1), task.Settings.MaxAttempts, "the invocation's max attempts win")
	require.Equal(t, settings(3).Backoff, task.Settings.Backoff)
	require.Equal(t, t0, task.RunAt)
	require.Equal(t, inv.Payload, task.Payload)
	require.Equal(t, "workflow", task.Origin)
	require.Equal(t, 1, p.Ready(ns, "send", t0))
	require.Equal(t, 1, p.Len())

	// A redelivered command changes nothing, whatever it says now.
	require.Empty(t, p.Invoke(nil, inv, nil, "", at(time.Second)))
	require.Equal(t, task, get(t, p, inv.TaskID))

	for _, tt := range []struct {
		name     string
		settings *store.Settings
		reject   string
		outcome  string
	}{
		{name: "unknown action", outcome: engine.RejectNotFound},
		{name: "disabled action", settings: settings(3), reject: engine.RejectDisabled, outcome: engine.RejectDisabled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := engine.New(0)
			inv := invocation("gone", 0)
			changes := q.Invoke(nil, inv, tt.settings, tt.reject, t0)
			require.Equal(t, []taskevent.Type{taskevent.Rejected}, types(changes))
			require.Equal(t, tt.outcome, changes[0].Task.Outcome)
			require.Contains(t, changes[0].Task.Error, `"gone"`)
			require.Equal(t, inv.TaskID, changes[0].Task.ID)
			require.False(t, q.Has(inv.TaskID), "a rejected invocation creates no task")
			require.Zero(t, q.Len())
		})
	}
}

func TestClaimOrder(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	type spec struct {
		action   string
		priority int32
		invoked  time.Duration // run_at: claimable from its invocation on
		created  time.Duration
	}
	// Listed in the order claims must hand them out.
	specs := []spec{
		{"b", 9, 0, 2 * time.Second},
		{"a", 5, -time.Minute, 0},
		{"b", 5, -time.Second, 0},
		{"a", 5, 0, -time.Minute},
		{"a", 5, 0, 0},
		{"b", 0, -time.Hour, 0},
	}
	now := at(time.Hour)
	var want []uuid.UUID
	for _, s := range specs {
		inv := invocation(s.action, s.priority)
		inv.InvokedAt = now.Add(s.created)
		require.Len(t, p.Invoke(nil, inv, settings(3), "", now.Add(s.invoked)), 1)
		require.Equal(t, now.Add(s.invoked), get(t, p, inv.TaskID).RunAt)
		want = append(want, inv.TaskID)
	}
	// Later ones: delayed, and another namespace's and action's.
	delayed := invocation("a", 99)
	delayed.RunAt = now.Add(time.Minute)
	p.Invoke(nil, delayed, settings(3), "", now)
	other := invocation("c", 99)
	p.Invoke(nil, other, settings(3), "", now)
	elsewhere := invocation("a", 99)
	elsewhere.Namespace = "other"
	p.Invoke(nil, elsewhere, settings(3), "", now)

	require.Equal(t, 3, p.Ready(ns, "a", now))
	require.Equal(t, 3, p.Ready(ns, "b", now))
	require.Equal(t, delayed.RunAt, p.NextDue())

	slots := []engine.Slot{{WorkerID: "w0"}, {WorkerID: "w1", Lease: time.Minute}, {WorkerID: "w2"}, {WorkerID: "w3"}}
	claimed, changes := p.Claim(ns, []string{"a", "b", "missing"}, slots, now)
	require.Len(t, claimed, 4)
	require.Len(t, changes, 4)
	secrets := map[string]bool{}
	for i, c := range claimed {
		require.Equal(t, i, c.Slot)
		require.Equal(t, want[i], c.Task.ID)
		require.Same(t, &changes[i].Task, c.Task, "the claimed task is its Started change's")
		require.Equal(t, taskevent.Started, changes[i].Type)
		require.Equal(t, store.Running, c.Task.Status)
		require.Equal(t, int32(1), c.Task.Attempt)
		require.Equal(t, slots[i].WorkerID, c.Task.WorkerID)
		require.Equal(t, now, c.Task.StartedAt)
		require.Len(t, c.Task.CompletionSecret, 16)
		secrets[string(c.Task.CompletionSecret)] = true
		require.Equal(t, *c.Task, get(t, p, c.Task.ID))
	}
	require.Len(t, secrets, 4)
	require.Equal(t, now.Add(30*time.Second), claimed[0].Task.LeaseUntil, "the task's timeout")
	require.Equal(t, now.Add(time.Minute), claimed[1].Task.LeaseUntil, "the slot's lease")
	require.Equal(t, now.Add(30*time.Second), p.NextDue(), "the first lease end")

	claimed, _ = p.Claim(ns, []string{"b", "a"}, slots, now)
	require.Len(t, claimed, 2)
	require.Equal(t, want[4:], []uuid.UUID{claimed[0].Task.ID, claimed[1].Task.ID})
	require.Zero(t, p.Ready(ns, "a", now))

	// The delayed task is claimable once due, not before.
	claimed, changes = p.Claim(ns, []string{"a"}, slots, delayed.RunAt.Add(-time.Millisecond))
	require.Empty(t, claimed)
	require.Empty(t, changes)
	require.Equal(t, 1, p.Ready(ns, "a", delayed.RunAt))
	claimed, _ = p.Claim(ns, []string{"a"}, slots, delayed.RunAt)
	require.Len(t, claimed, 1)
	require.Equal(t, delayed.TaskID, claimed[0].Task.ID)
	require.ElementsMatch(t, []string{store.Key(ns, "c"), store.Key("other", "a")}, p.Actions(delayed.RunAt))
	require.Empty(t, mustClaim(p, nil))
}

func mustClaim(p *engine.Partition, slots []engine.Slot) []engine.Claimed {
	claimed, _ := p.Claim(ns, []string{"c"}, slots, t0)
	return claimed
}

func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	task := running(t, p, 2, t0)
	end := t0.Add(30 * time.Second)
	require.Equal(t, end, task.LeaseUntil)
	require.Equal(t, end, p.NextDue())
	require.Empty(t, p.Tick(end.Add(-time.Nanosecond)))

	changes := p.Tick(end)
	require.Equal(t, []taskevent.Type{taskevent.LeaseExpired}, types(changes))
	got := get(t, p, task.ID)
	require.Equal(t, changes[0].Task, got)
	require.Equal(t, store.Queued, got.Status)
	require.Equal(t, int32(1), got.Attempt, "the expired attempt counts")
	require.Equal(t, "lease expired", got.Error)
	require.True(t, got.TimedOut)
	require.Zero(t, got.LeaseUntil)
	require.Equal(t, end, got.RunAt)
	require.Zero(t, p.NextDue())
	require.Equal(t, 1, p.Ready(ns, "send", end))

	// The last attempt's lease dead-letters the task.
	task = claimOne(t, p, "send", end)
	require.Equal(t, int32(2), task.Attempt)
	changes = p.Tick(task.LeaseUntil.Add(time.Hour))
	require.Equal(t, []taskevent.Type{taskevent.LeaseExpired, taskevent.DeadLettered}, types(changes))
	got = get(t, p, task.ID)
	require.Equal(t, store.DeadLettered, got.Status)
	require.Equal(t, task.LeaseUntil.Add(time.Hour), got.FinishedAt)
	require.Equal(t, end, got.RunAt, "a dead letter keeps its run_at")
	require.True(t, got.TimedOut)
}

func TestTouch(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	task := running(t, p, 3, t0)
	now := at(20 * time.Second)

	until, changes, err := p.Touch(ns, task.ID, 1, time.Minute, now)
	require.NoError(t, err)
	require.Equal(t, now.Add(time.Minute), until)
	require.Equal(t, []taskevent.Type{taskevent.LeaseExtended}, types(changes))
	require.Equal(t, until, get(t, p, task.ID).LeaseUntil)
	require.Equal(t, until, p.NextDue())
	require.Empty(t, p.Tick(task.LeaseUntil), "the old lease end passes harmlessly")

	until, _, err = p.Touch(ns, task.ID, 1, 0, now)
	require.NoError(t, err)
	require.Equal(t, now.Add(30*time.Second), until, "zero extends by the task's timeout")
	until, _, err = p.Touch(ns, task.ID, 1, 1000*time.Hour, now)
	require.NoError(t, err)
	require.Equal(t, now.Add(engine.MaxExtend), until)

	// Many extensions leave one live lease.
	for i := range 1000 {
		_, _, err = p.Touch(ns, task.ID, 1, time.Second, now.Add(time.Duration(i)*time.Millisecond))
		require.NoError(t, err)
	}
	last := now.Add(999*time.Millisecond + time.Second)
	require.Equal(t, last, p.NextDue())
	require.Equal(t, []taskevent.Type{taskevent.LeaseExpired}, types(p.Tick(last)))

	for _, tt := range []struct {
		name    string
		ns      string
		id      uuid.UUID
		attempt int32
		extend  time.Duration
		kind    fault.Kind
	}{
		{name: "not running any more", ns: ns, id: task.ID, attempt: 1, kind: fault.Precondition},
		{name: "wrong attempt", ns: ns, id: task.ID, attempt: 2, kind: fault.Precondition},
		{name: "unknown task", ns: ns, id: uuid.New(), attempt: 1, kind: fault.Precondition},
		{name: "wrong namespace", ns: "other", id: task.ID, attempt: 1, kind: fault.Precondition},
		{name: "negative", ns: ns, id: task.ID, attempt: 1, extend: -time.Second, kind: fault.Invalid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, changes, err := p.Touch(tt.ns, tt.id, tt.attempt, tt.extend, now)
			kind, _, ok := fault.KindOf(err)
			require.True(t, ok)
			require.Equal(t, tt.kind, kind)
			require.Empty(t, changes)
			if tt.kind == fault.Precondition {
				require.ErrorIs(t, err, engine.ErrNotRunning)
			}
		})
	}
}

func TestAsyncDeadline(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	task := running(t, p, 3, t0)
	ok, _ := p.Report(nil, ns, engine.Report{TaskID: task.ID.String(), Attempt: 1, Kind: engine.Pending, Delay: time.Hour}, t0)
	require.True(t, ok)
	deadline := t0.Add(time.Hour)
	require.Equal(t, deadline, p.NextDue(), "no lease while waiting; the deadline")
	require.Empty(t, p.Tick(deadline.Add(-time.Nanosecond)))
	changes := p.Tick(deadline)
	require.Equal(t, []taskevent.Type{taskevent.Failed}, types(changes))
	got := get(t, p, task.ID)
	require.Equal(t, store.Failed, got.Status)
	require.Equal(t, "no result by the async deadline", got.Error)
	require.True(t, got.TimedOut)
	require.Zero(t, got.CompleteBy)
	require.Equal(t, deadline, got.FinishedAt)
	require.Zero(t, p.NextDue())
}

func TestRequeue(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	task := running(t, p, 1, t0)
	ok, _ := p.Report(nil, ns, engine.Report{TaskID: task.ID.String(), Attempt: 1, Kind: engine.Fail, Error: "boom", ErrorCode: "E1", TimedOut: true}, t0)
	require.True(t, ok)
	require.Equal(t, store.DeadLettered, get(t, p, task.ID).Status)

	_, _, err := p.Requeue("other", task.ID, t0)
	requireKind(t, fault.NotFound, err)
	_, _, err = p.Requeue(ns, uuid.New(), t0)
	requireKind(t, fault.NotFound, err)

	now := at(time.Hour)
	got, changes, err := p.Requeue(ns, task.ID, now)
	require.NoError(t, err)
	require.Equal(t, []taskevent.Type{taskevent.Requeued}, types(changes))
	require.Equal(t, got, changes[0].Task)
	require.Equal(t, store.Queued, got.Status)
	require.Zero(t, got.Attempt)
	require.Empty(t, got.Error)
	require.Empty(t, got.ErrorCode)
	require.False(t, got.TimedOut)
	require.Equal(t, now, got.RunAt)
	require.Zero(t, got.FinishedAt)
	require.Equal(t, task.Payload, got.Payload)
	require.Equal(t, 1, p.Ready(ns, "send", now))

	_, _, err = p.Requeue(ns, task.ID, now)
	requireKind(t, fault.Precondition, err)
	require.Equal(t, int32(1), claimOne(t, p, "send", now).Attempt)
}

func requireKind(t *testing.T, want fault.Kind, err error) {
	t.Helper()
	kind, _, ok := fault.KindOf(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, want, kind)
}

func TestEviction(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	done := running(t, p, 1, t0)
	ok, _ := p.Report(nil, ns, engine.Report{TaskID: done.ID.String(), Attempt: 1, Kind: engine.Complete}, t0)
	require.True(t, ok)
	done = get(t, p, done.ID)
	live := invoke(t, p, "send", 1, t0)
	dead := running(t, p, 1, t0)
	ok, _ = p.Report(nil, ns, engine.Report{TaskID: dead.ID.String(), Attempt: 1, Kind: engine.Fail}, t0)
	require.True(t, ok)
	p.Recorded(done.ID, 5)
	p.Recorded(live, 6)
	p.Recorded(dead.ID, 7)

	p.Materialized(4)
	require.Equal(t, 3, p.Len())
	p.Materialized(5)
	require.False(t, p.Has(done.ID), "final and in the view")
	require.True(t, p.Has(live))
	require.True(t, p.Has(dead.ID))

	// A dead letter requeued after its record is live again.
	_, _, err := p.Requeue(ns, dead.ID, t0)
	require.NoError(t, err)
	p.Materialized(100)
	require.True(t, p.Has(dead.ID))
	require.True(t, p.Has(live), "live tasks stay whatever the view holds")

	// An evicted task loaded back (to requeue it) goes at the next
	// materialization unless it changed.
	p.Load(done)
	require.True(t, p.Has(done.ID))
	got := get(t, p, done.ID)
	require.Equal(t, done, got)
	p.Materialized(100)
	require.Equal(t, 2, p.Len())
}
