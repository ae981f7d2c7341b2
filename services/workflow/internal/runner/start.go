package runner

import (
	"context"
	"encoding/json"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/workflow/internal/catalog"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// StartRequest asks for a run of a workflow.
type StartRequest struct {
	Namespace string
	Workflow  string
	// Version empty starts the latest version.
	Version string
	// Input is the run's JSON input; empty means {}.
	Input          []byte
	IdempotencyKey string
	// TraceContext is the W3C trace context of the caller; the run's
	// invocations continue it.
	TraceContext map[string]string
	// Trigger is set by a stream trigger, with no IdempotencyKey: the
	// records the run starts for, which make it idempotent whatever the
	// workflow's idempotency mode.
	Trigger *TriggerStart
}

// StartResult is the run a start created or found.
type StartResult struct {
	RunID string
	// Created is false when the idempotency key named an existing run.
	Created bool
}

// Start starts a run, or returns the run an idempotency key already started,
// in one transaction with concurrent starts. It refuses workflows that do not
// exist (NotFound) or are disabled (Precondition), bad input (Invalid) and
// keys the workflow's idempotency mode does not allow (Invalid).
func (r *Runner) Start(ctx context.Context, req StartRequest) (StartResult, error) {
	if err := r.checkStart(&req); err != nil {
		return StartResult{}, err
	}
	return r.starts.Do(ctx, req)
}

func (r *Runner) checkStart(req *StartRequest) error {
	if err := text.Name("namespace", req.Namespace); err != nil {
		return err
	}
	if err := text.Name("workflow", req.Workflow); err != nil {
		return err
	}
	if req.Version != "" {
		if err := text.Version("version", req.Version); err != nil {
			return err
		}
	}
	if err := text.Key("idempotency_key", req.IdempotencyKey); err != nil {
		return err
	}
	input, err := checkJSON("input", req.Input, r.cfg.MaxPayloadBytes)
	if err != nil {
		return err
	}
	req.Input = input
	return nil
}

// checkJSON validates a JSON payload, defaulting an empty one to {}.
func checkJSON(field string, b []byte, maxBytes int) ([]byte, error) {
	if len(b) == 0 {
		return []byte(`{}`), nil
	}
	if maxBytes > 0 && len(b) > maxBytes {
		return nil, fault.Invalidf("%s is %d bytes, larger than the limit of %d", field, len(b), maxBytes)
	}
	if !json.Valid(b) {
		return nil, fault.Invalidf("%s is not valid JSON", field)
	}
	return b, nil
}

// execStarts applies a batch of starts in one transaction. Each call gets its
// own result or error; only a database failure fails them all.
func (r *Runner) execStarts(ctx context.Context, calls []*coalesce.Call[StartRequest, StartResult]) error {
	return r.inUnit(ctx, func(u *unit) error {
		for _, c := range calls {
			c.Resp, c.Err = StartResult{}, nil
		}
		return u.start(ctx, calls)
	})
}

func (u *unit) start(ctx context.Context, calls []*coalesce.Call[StartRequest, StartResult]) error {
	// Which version each start runs, and whether it may start at all.
	names := make([]store.NameKey, 0, len(calls))
	for _, c := range calls {
		names = append(names, store.NameKey{Namespace: c.Req.Namespace, Name: c.Req.Workflow})
	}
	heads, err := store.Heads(ctx, u.tx, names)
	if err != nil {
		return err
	}
	versions := make([]store.VersionKey, len(calls))
	var wanted []store.VersionKey
	for i, c := range calls {
		h, ok := heads[names[i]]
		switch {
		case !ok:
			c.Err = catalog.NotFound(c.Req.Workflow, "")
			continue
		case !h.Enabled:
			c.Err = fault.Preconditionf("workflow %s is disabled: new runs are refused until it is enabled", c.Req.Workflow)
			continue
		}
		v := c.Req.Version
		if v == "" {
			v = h.LatestVersion
		}
		versions[i] = store.VersionKey{Namespace: c.Req.Namespace, Name: c.Req.Workflow, Version: v}
		wanted = append(wanted, versions[i])
	}
	defs, err := u.r.catalog.Definitions(ctx, u.tx, wanted)
	if err != nil {
		return err
	}

	// Idempotency: keys already used name their run; keys repeated within
	// the batch start one run.
	var keys []store.IdempotencyKey
	for i, c := range calls {
		if c.Err != nil {
			continue
		}
		def, ok := defs[versions[i]]
		if !ok {
			c.Err = catalog.NotFound(c.Req.Workflow, versions[i].Version)
			continue
		}
		if c.Req.Trigger == nil {
			if c.Err = checkIdempotency(def, c.Req); c.Err != nil {
				continue
			}
		}
		if c.Req.IdempotencyKey != "" {
			keys = append(keys, store.IdempotencyKey{Namespace: c.Req.Namespace, Workflow: c.Req.Workflow, Key: c.Req.IdempotencyKey})
		}
	}
	existing := map[store.IdempotencyKey]string{}
	if len(keys) > 0 {
		if existing, err = store.RunsByIdempotencyKey(ctx, u.tx, keys); err != nil {
			return err
		}
	}

	for i, c := range calls {
		if c.Err != nil {
			continue
		}
		key := store.IdempotencyKey{Namespace: c.Req.Namespace, Workflow: c.Req.Workflow, Key: c.Req.IdempotencyKey}
		if key.Key != "" {
			if id, ok := existing[key]; ok {
				c.Resp = StartResult{RunID: id}
				continue
			}
		}
		run := &store.Run{
			Run: engine.Run{
				ID: newRunID(), Namespace: c.Req.Namespace, Workflow: c.Req.Workflow, Version: versions[i].Version,
				Status: engine.StatusPending, Input: c.Req.Input, CreatedAt: u.now, UpdatedAt: u.now,
			},
			IdempotencyKey: c.Req.IdempotencyKey,
			TraceContext:   c.Req.TraceContext,
		}
		if c.Req.Trigger != nil {
			ok, err := u.claimTrigger(ctx, c, run)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
		}
		if c.Err = setAttributes(run, defs[versions[i]]); c.Err != nil {
			if c.Req.Trigger != nil {
				// The records start no run after all.
				if err := store.ReleaseTriggerRecords(ctx, u.tx, run.ID); err != nil {
					return err
				}
			}
			continue
		}
		if key.Key != "" {
			existing[key] = run.ID
		}
		e := u.add(run, true)
		e.def = defs[versions[i]]
		u.pending[run.ID] = nil
		if run.TriggerRecord != "" {
			run.HistorySeq++
			u.history = append(u.history, store.HistoryRow{RunID: run.ID, Seq: run.HistorySeq, HistoryEvent: engine.HistoryEvent{
				Type: engine.HistoryTriggerFired, Detail: run.TriggerRecord, At: u.now,
			}})
		}
		if err := u.advance(ctx, e, engine.Started{}); err != nil {
			return err
		}
		c.Resp = StartResult{RunID: run.ID, Created: true}
	}
	return nil
}

// checkIdempotency applies the workflow's idempotency mode to a start.
func checkIdempotency(def *definition.Definition, req StartRequest) error {
	switch def.Idempotency {
	case definition.IdempotencyRequired:
		if req.IdempotencyKey == "" {
			return fault.Invalidf("workflow %s requires an idempotency key (idempotency: required)", def.Name)
		}
	case definition.IdempotencyNone, "":
		if req.IdempotencyKey != "" {
			return fault.Invalidf("workflow %s takes no idempotency key (idempotency: none); set idempotency to optional or required to use one", def.Name)
		}
	}
	return nil
}
