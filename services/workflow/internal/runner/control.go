package runner

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// Signal stores a signal with a run and advances the run with it: a step
// waiting for its type resumes; otherwise it is kept for a later step. Runs
// that ended refuse signals (Precondition).
func (r *Runner) Signal(ctx context.Context, namespace, runID, typ string, payload []byte) (string, error) {
	if err := checkRun(namespace, runID); err != nil {
		return "", err
	}
	if err := text.SignalType("type", typ); err != nil {
		return "", err
	}
	payload, err := checkJSON("payload", payload, r.cfg.MaxPayloadBytes)
	if err != nil {
		return "", err
	}
	var id string
	err = r.inUnit(ctx, func(u *unit) error {
		e, err := u.lockIn(ctx, namespace, runID)
		if err != nil {
			return err
		}
		if e.run.Status.Ended() {
			return fault.Preconditionf("run %s has ended (%s); it takes no more signals", runID, e.run.Status)
		}
		// A signal the run waits for is taken at once and joins no backlog.
		waited := e.run.Wait == engine.WaitSignal && e.run.WaitingFor == typ
		if !waited {
			if err := checkBacklog(runID, u.pending[runID], len(payload), r.cfg.MaxPayloadBytes); err != nil {
				return err
			}
			if err := r.admitSignal(ctx, u.tx, namespace); err != nil {
				return err
			}
		}
		sig := engine.Signal{ID: newRunID(), Type: typ, Payload: payload, ReceivedAt: u.now}
		if err := store.InsertSignal(ctx, u.tx, namespace, runID, sig); err != nil {
			return err
		}
		u.pending[runID] = append(u.pending[runID], sig)
		id = sig.ID
		return u.advance(ctx, e, engine.SignalArrived{Signal: sig})
	})
	if err != nil {
		return "", err
	}
	return id, nil
}

// checkBacklog refuses a signal that would take a run's unconsumed signals
// past store.MaxPendingSignals or their payloads past
// PendingPayloadFactor payload limits: every advance of the run loads them.
func checkBacklog(runID string, pending []engine.Signal, size, maxPayload int) error {
	if len(pending) >= store.MaxPendingSignals {
		return fault.Exhaustedf("run %s holds %d signals no step has taken, the most a run may hold", runID, len(pending))
	}
	total := size
	for _, s := range pending {
		total += len(s.Payload)
	}
	if limit := PendingPayloadFactor * maxPayload; maxPayload > 0 && total > limit {
		return fault.Exhaustedf("run %s: the payloads of the signals no step has taken would total %d bytes, more than the limit of %d", runID, total, limit)
	}
	return nil
}

// admitSignal refuses a signal that would join a backlog past the
// namespace's limit of signals no step has taken. It locks the namespace's
// backlog until tx ends, so signals racing for the last place cannot both
// get it; signals a run waits for are taken at once and need no place.
func (r *Runner) admitSignal(ctx context.Context, tx *pg.BatchTx, namespace string) error {
	if err := pg.LockXact(ctx, tx, "flo.workflow.signals/"+namespace); err != nil {
		return err
	}
	n, err := store.CountPendingSignals(ctx, tx, namespace)
	if err != nil {
		return err
	}
	if limit := r.cfg.MaxPendingSignalsPerNamespace; n >= limit {
		return fault.Exhaustedf("namespace %s has %d signals no step has taken, the limit is %d (FLO_MAX_PENDING_SIGNALS_PER_NAMESPACE)", namespace, n, limit)
	}
	return nil
}

// PendingPayloadFactor bounds the payloads of a run's unconsumed signals, in
// payload limits (FLO_MAX_PAYLOAD_BYTES).
const PendingPayloadFactor = 4

// Cancel cancels a run and, with it, the children it waits for. Cancelling a
// cancelled run returns it unchanged; a run that ended otherwise refuses
// (Precondition).
func (r *Runner) Cancel(ctx context.Context, namespace, runID, reason string) (*store.Run, error) {
	if err := checkRun(namespace, runID); err != nil {
		return nil, err
	}
	if reason == "" {
		reason = "cancelled by request"
	}
	var run *store.Run
	err := r.inUnit(ctx, func(u *unit) error {
		e, err := u.lockIn(ctx, namespace, runID)
		if err != nil {
			return err
		}
		run = e.run
		switch {
		case e.run.Status == engine.StatusCancelled:
			return nil
		case e.run.Status.Ended():
			return fault.Preconditionf("run %s has already ended (%s)", runID, e.run.Status)
		}
		return u.advance(ctx, e, engine.Cancel{Reason: text.Clean(reason, text.MaxFreeBytes)})
	})
	if err != nil {
		return nil, err
	}
	return run, nil
}

// lockIn locks a run of a namespace; NotFound when there is none.
func (u *unit) lockIn(ctx context.Context, namespace, runID string) (*entry, error) {
	e, err := u.lock(ctx, runID)
	if err != nil {
		return nil, err
	}
	if e == nil || e.run.Namespace != namespace {
		return nil, fault.NotFoundf("run %s not found", runID)
	}
	return e, nil
}

// checkRun validates the names every run call carries.
func checkRun(namespace, runID string) error {
	if err := text.Name("namespace", namespace); err != nil {
		return err
	}
	if runID == "" {
		return fault.Invalidf("run_id is required")
	}
	if _, err := uuid.Parse(runID); err != nil {
		return fault.Invalidf("run_id %q is not a run id", runID)
	}
	return nil
}

// Get reads a run.
func (r *Runner) Get(ctx context.Context, namespace, runID string) (*store.Run, error) {
	if err := checkRun(namespace, runID); err != nil {
		return nil, err
	}
	run, err := store.GetRun(ctx, r.pool, namespace, runID)
	if errors.Is(err, pg.ErrNotFound) {
		return nil, fault.NotFoundf("run %s not found", runID)
	}
	return run, err
}

// History reads a run's history in order.
func (r *Runner) History(ctx context.Context, namespace, runID string) ([]store.HistoryRow, error) {
	if _, err := r.Get(ctx, namespace, runID); err != nil {
		return nil, err
	}
	return store.History(ctx, r.pool, runID)
}

// List lists a page of runs newest first, with the token of the next page.
// where is a query (package query) the runs must match; empty matches all.
func (r *Runner) List(ctx context.Context, f store.RunFilter, where string, p page.Page) ([]*store.Run, string, error) {
	switch {
	case f.Namespace == "":
		return nil, "", fault.Invalidf("namespace is required")
	case !f.CreatedAfter.IsZero() && !f.CreatedBefore.IsZero() && !f.CreatedAfter.Before(f.CreatedBefore):
		return nil, "", fault.Invalidf("created_after must be before created_before")
	}
	if p.After != nil {
		us, err := p.Int(0)
		if err != nil {
			return nil, "", err
		}
		if _, err := uuid.Parse(p.After[1]); err != nil {
			return nil, "", page.BadToken()
		}
		f.AfterCreatedAt, f.AfterID = time.UnixMicro(us), p.After[1]
	}
	var err error
	if f.Where, err = r.where(ctx, f.Namespace, f.Workflow, where); err != nil {
		return nil, "", err
	}
	f.Limit = p.Fetch()
	runs, err := store.ListRuns(ctx, r.pool, f)
	if err != nil {
		return nil, "", fmt.Errorf("list runs: %w", err)
	}
	runs, next := page.Cut(p, runs, func(run *store.Run) []string {
		return []string{strconv.FormatInt(run.CreatedAt.UnixMicro(), 10), run.ID}
	})
	return runs, next, nil
}
