package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// entry is one run a unit touched.
type entry struct {
	run   *store.Run
	def   *definition.Definition
	isNew bool
	dirty bool
}

// unit is one transaction's worth of run changes: the runs it loaded
// (locked) or created, and everything their advances emitted, written by
// flush in a handful of statements however many runs took part.
type unit struct {
	r   *Runner
	tx  *pg.BatchTx
	now time.Time

	runs  map[string]*entry
	order []*entry
	// pending holds each run's unconsumed signals once read.
	pending map[string][]engine.Signal

	history  []store.HistoryRow
	records  []outbox.Record
	timers   map[string][]store.Timer // replacement timers by run
	consumed []string
	soonest  time.Time
	// gate answers plan steps; planEvents reach the registry after the
	// commit, cacheWrites go with it.
	gate        *planGate
	planEvents  []engine.PlanEvent
	cacheWrites []engine.CacheWrite

	started, advanced int
	ended             map[engine.Status]int
}

// newUnit starts a unit. Its clock is cut to the microsecond Postgres
// keeps, so times read back from columns equal the ones in run state (page
// tokens compare against created_at).
func (r *Runner) newUnit() *unit {
	return &unit{
		r: r, now: r.now().Truncate(time.Microsecond), runs: map[string]*entry{}, pending: map[string][]engine.Signal{},
		timers: map[string][]store.Timer{}, ended: map[engine.Status]int{},
	}
}

// add registers a run with the unit.
func (u *unit) add(run *store.Run, isNew bool) *entry {
	e := &entry{run: run, isNew: isNew}
	u.runs[run.ID] = e
	u.order = append(u.order, e)
	return e
}

// lockRuns loads and locks runs not in the unit yet, with their pending
// signals, in one round trip.
func (u *unit) lockRuns(ctx context.Context, ids []string, skipLocked bool) error {
	var want []string
	for _, id := range ids {
		if _, ok := u.runs[id]; !ok {
			want = append(want, id)
		}
	}
	if len(want) == 0 {
		return nil
	}
	locked, sigs, err := store.LockRuns(ctx, u.tx, want, skipLocked)
	if err != nil {
		return err
	}
	for _, id := range want {
		if run, ok := locked[id]; ok {
			u.add(run, false)
			u.pending[id] = sigs[id]
		}
	}
	return nil
}

// lock returns the run with id, loading and locking it when the unit does
// not have it; nil when it does not exist.
func (u *unit) lock(ctx context.Context, id string) (*entry, error) {
	if err := u.lockRuns(ctx, []string{id}, false); err != nil {
		return nil, err
	}
	return u.runs[id], nil
}

// definition returns the parsed definition of e's run.
func (u *unit) definition(ctx context.Context, e *entry) (*definition.Definition, error) {
	if e.def != nil {
		return e.def, nil
	}
	k := store.VersionKey{Namespace: e.run.Namespace, Name: e.run.Workflow, Version: e.run.Version}
	defs, err := u.r.catalog.Definitions(ctx, u.tx, []store.VersionKey{k})
	if err != nil {
		return nil, err
	}
	e.def = defs[k]
	return e.def, nil
}

// advance moves e's run with ev and applies the effects. Runs that ended
// do not move. An engine error, or a definition that cannot be read, fails
// the run rather than leaving it stuck; a database error aborts the unit.
func (u *unit) advance(ctx context.Context, e *entry, ev any) error {
	run := &e.run.Run
	if run.Status.Ended() {
		return nil
	}
	def, err := u.definition(ctx, e)
	if err != nil {
		return err
	}
	before := run.Status
	var eff engine.Effects
	if def == nil {
		eff = u.fail(e, fmt.Sprintf("workflow %s version %s no longer exists", run.Workflow, run.Version))
	} else {
		saved := *run
		saved.Outputs = cloneOutputs(run.Outputs)
		if u.gate == nil {
			u.gate = &planGate{db: u.tx, reg: u.r.plans}
		}
		u.gate.ctx = ctx
		eff, err = engine.Advance(def, run, ev, engine.Env{
			Now: u.now, Rand: random, Pending: u.pending[run.ID], NewID: newRunID, MaxPayloadBytes: u.r.cfg.MaxPayloadBytes,
			Plans: u.gate,
		})
		if u.gate.err != nil {
			// The plan gate could not read or write its state: the
			// advance is discarded and the unit runs again.
			*run = saved
			return fmt.Errorf("advance run %s: %w", run.ID, u.gate.err)
		}
		if err != nil {
			u.r.log.ErrorContext(ctx, "engine could not advance run; failing it", "run_id", run.ID, "event", fmt.Sprintf("%T", ev), "error", err)
			*run = saved
			eff = u.fail(e, "internal error advancing the run: "+err.Error())
		}
	}
	u.advanced++
	e.dirty = true
	run.UpdatedAt = u.now
	if run.Status.Ended() && run.FinishedAt.IsZero() {
		run.FinishedAt = u.now
	}
	if err := u.apply(e, before, eff); err != nil {
		return err
	}
	for _, c := range eff.Children {
		if err := u.startChild(ctx, e, c); err != nil {
			return err
		}
	}
	if run.Status.Ended() {
		return u.afterEnd(ctx, e)
	}
	return nil
}

// fail ends a run as failed for a reason the engine did not decide.
func (u *unit) fail(e *entry, reason string) engine.Effects {
	run := &e.run.Run
	run.Status = engine.StatusFailed
	run.Terminal = definition.TerminalFailed
	run.Error = reason
	run.Wait = engine.WaitNone
	run.WaitingFor = ""
	run.Deadline = time.Time{}
	run.FinishedAt = u.now
	return engine.Effects{
		ClearTimers: true,
		Ended:       true,
		History: []engine.HistoryEvent{{
			Type: engine.HistoryWorkflowFailed, Step: run.Step, Detail: reason, At: u.now,
		}},
	}
}

// apply records an advance's history, invocations, timers, consumed signals
// and status change.
func (u *unit) apply(e *entry, before engine.Status, eff engine.Effects) error {
	run := e.run
	for _, h := range eff.History {
		if h.At.IsZero() {
			h.At = u.now
		}
		run.HistorySeq++
		u.history = append(u.history, store.HistoryRow{RunID: run.ID, Seq: run.HistorySeq, HistoryEvent: h})
	}
	u.planEvents = append(u.planEvents, eff.PlanEvents...)
	u.cacheWrites = append(u.cacheWrites, eff.CacheWrites...)
	for _, inv := range eff.Invokes {
		rec, err := invokeRecord(run, inv, u.now)
		if err != nil {
			return err
		}
		u.records = append(u.records, rec)
	}
	if len(eff.Timers) > 0 || eff.ClearTimers {
		set := make([]store.Timer, 0, len(eff.Timers))
		for _, t := range eff.Timers {
			set = append(set, store.Timer{RunID: run.ID, Token: t.Token, Kind: string(t.Kind), FireAt: t.At})
			if u.soonest.IsZero() || t.At.Before(u.soonest) {
				u.soonest = t.At
			}
		}
		u.timers[run.ID] = set
	}
	if len(eff.ConsumedSignals) > 0 {
		u.consumed = append(u.consumed, eff.ConsumedSignals...)
		used := make(map[string]bool, len(eff.ConsumedSignals))
		for _, id := range eff.ConsumedSignals {
			used[id] = true
		}
		left := u.pending[run.ID][:0:0]
		for _, s := range u.pending[run.ID] {
			if !used[s.ID] {
				left = append(left, s)
			}
		}
		u.pending[run.ID] = left
	}
	recs, err := statusRecords(run, before, u.now)
	if err != nil {
		return err
	}
	u.records = append(u.records, recs...)
	if before == engine.StatusPending && run.Status != engine.StatusPending {
		u.started++
	}
	if run.Status.Ended() {
		u.ended[run.Status]++
	}
	return nil
}

// startChild creates a child run and starts it in this transaction. A child
// that cannot start resumes its parent at once with target_not_found.
func (u *unit) startChild(ctx context.Context, parent *entry, c engine.ChildStart) error {
	p := parent.run
	if p.Depth+1 > MaxDepth {
		return u.childFailed(ctx, parent, c, fmt.Sprintf("child workflow %s not started: runs nest at most %d levels deep", c.Workflow, MaxDepth))
	}
	version := c.Version
	if version == "" {
		heads, err := store.Heads(ctx, u.tx, []store.NameKey{{Namespace: p.Namespace, Name: c.Workflow}})
		if err != nil {
			return err
		}
		h, ok := heads[store.NameKey{Namespace: p.Namespace, Name: c.Workflow}]
		if !ok {
			return u.childFailed(ctx, parent, c, fmt.Sprintf("workflow %s not found", c.Workflow))
		}
		version = h.LatestVersion
	}
	k := store.VersionKey{Namespace: p.Namespace, Name: c.Workflow, Version: version}
	defs, err := u.r.catalog.Definitions(ctx, u.tx, []store.VersionKey{k})
	if err != nil {
		return err
	}
	def, ok := defs[k]
	if !ok {
		return u.childFailed(ctx, parent, c, fmt.Sprintf("workflow %s version %s not found", c.Workflow, version))
	}
	input := c.Input
	if len(input) == 0 {
		input = json.RawMessage(`{}`)
	}
	child := &store.Run{
		Run: engine.Run{
			ID: c.RunID, Namespace: p.Namespace, Workflow: c.Workflow, Version: version,
			Status: engine.StatusPending, Input: input, ParentRunID: p.ID, ParentToken: c.ParentToken,
			CreatedAt: u.now, UpdatedAt: u.now,
		},
		Depth:        p.Depth + 1,
		TraceContext: p.TraceContext,
	}
	if err := setAttributes(child, def); err != nil {
		// Bad input is the parent's doing, found before the child ran.
		return u.advance(ctx, parent, engine.TaskEnded{
			Token: c.ParentToken, Outcome: definition.OutcomeExecutionFailure, Error: fmt.Sprintf("child workflow %s not started: %v", c.Workflow, err),
		})
	}
	e := u.add(child, true)
	e.def = def
	u.pending[child.ID] = nil
	return u.advance(ctx, e, engine.Started{})
}

func (u *unit) childFailed(ctx context.Context, parent *entry, c engine.ChildStart, reason string) error {
	return u.advance(ctx, parent, engine.TaskEnded{
		Token: c.ParentToken, Outcome: definition.OutcomeTargetNotFound, Error: reason,
	})
}

// afterEnd resumes the parent of a run that reached a terminal and cancels the
// children of a run that was cancelled.
func (u *unit) afterEnd(ctx context.Context, e *entry) error {
	run := e.run
	if run.Status == engine.StatusCancelled {
		ids, err := store.ActiveChildren(ctx, u.tx, []string{run.ID})
		if err != nil {
			return err
		}
		for _, id := range ids {
			child, err := u.lock(ctx, id)
			if err != nil {
				return err
			}
			if child == nil {
				continue
			}
			if err := u.advance(ctx, child, engine.Cancel{Reason: "parent run " + run.ID + " was cancelled"}); err != nil {
				return err
			}
		}
	}
	if run.ParentRunID == "" {
		return nil
	}
	parent, err := u.lock(ctx, run.ParentRunID)
	if err != nil || parent == nil || parent.run.Status.Ended() {
		return err
	}
	return u.advance(ctx, parent, engine.ChildEnded{Token: run.ParentToken, Status: run.Status, Output: lastOutput(&run.Run)})
}

// lastOutput is a finished run's output: that of its most recently finished
// step, the one whose transition ended it.
func lastOutput(r *engine.Run) json.RawMessage {
	var (
		out  json.RawMessage
		last time.Time
	)
	for _, res := range r.Outputs {
		if out == nil || res.FinishedAt.After(last) {
			out, last = res.Output, res.FinishedAt
		}
	}
	return out
}

func cloneOutputs(m map[string]engine.StepResult) map[string]engine.StepResult {
	if m == nil {
		return nil
	}
	out := make(map[string]engine.StepResult, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// writes are the statements that write everything the unit did; they go
// to Postgres with the commit, in one round trip.
func (u *unit) writes(ctx context.Context) (*store.Writes, error) {
	var (
		w                store.Writes
		inserts, updates []*store.Run
	)
	u.fillAttributes(ctx)
	for _, e := range u.order {
		switch {
		case e.isNew:
			inserts = append(inserts, e.run)
		case e.dirty:
			updates = append(updates, e.run)
		}
	}
	if err := w.InsertRuns(inserts); err != nil {
		return nil, err
	}
	if err := w.UpdateRuns(updates); err != nil {
		return nil, err
	}
	w.AppendHistory(u.history)
	if len(u.timers) > 0 {
		var (
			clear []string
			set   []store.Timer
		)
		for id, ts := range u.timers {
			if !u.runs[id].isNew {
				clear = append(clear, id)
			}
			set = append(set, ts...)
		}
		w.ReplaceTimers(clear, set)
		// Other replicas learn about timers due before their next safety
		// tick; later ones they find on a tick anyway.
		if !u.soonest.IsZero() && u.soonest.Before(u.now.Add(u.r.cfg.SafetyTick)) {
			w.NotifyTimers()
		}
	}
	w.ConsumeSignals(u.consumed, u.now)
	w.PutCache(u.cacheWrites)
	if err := w.WriteOutbox(ctx, u.records); err != nil {
		return nil, fmt.Errorf("write run records: %w", err)
	}
	return &w, nil
}

// committed wakes whoever should act on what the unit committed.
func (u *unit) committed(ctx context.Context) {
	if len(u.records) > 0 && u.r.relay != nil {
		u.r.relay.Notify()
	}
	if !u.soonest.IsZero() && u.r.timers != nil {
		u.r.timers.Wake(u.soonest)
	}
	u.r.plans.Apply(ctx, u.planEvents)
	u.r.advances.Add(ctx, int64(u.advanced))
	u.r.runsStarted.Add(ctx, int64(u.started))
	for st, n := range u.ended {
		u.r.runsEnded.Add(ctx, int64(n), statusAttr(string(st)))
	}
}
