package engine

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// Why an invocation creates no task: the outcome of its REJECTED event.
const (
	RejectNotFound = "target_not_found"
	RejectDisabled = "target_disabled"
)

// Invocation is one decoded InvokeTask command.
type Invocation struct {
	TaskID         uuid.UUID
	Namespace      string
	Action         string
	Payload        []byte
	IdempotencyKey string
	Priority       int32
	TraceContext   map[string]string
	// Origin is who invoked the task; see eventsv1.InvokeTask.
	Origin string
	// MaxAttempts, when positive, overrides the action's.
	MaxAttempts int32
	InvokedAt   time.Time
	// RunAt zero means at once.
	RunAt time.Time
}

// Invoke creates the task of inv, queued with the action's settings s
// copied in (a positive inv.MaxAttempts overrides s.MaxAttempts), and
// appends its Created change to changes. When s is nil (the action does not
// exist, RejectNotFound) or reject is set (RejectDisabled), it creates no
// task and appends a Rejected change, since retrying the invocation cannot
// succeed. An invocation of a task already held is a redelivery and changes
// nothing; the owner looks up in the view the ids of those it may know only
// there (Cold). Invoke and Report append to the batch's list rather than
// return one of their own: a list made per call was a tenth of what the
// engine allocated.
func (p *Partition) Invoke(changes []Change, inv Invocation, s *store.Settings, reject string, now time.Time) []Change {
	if p.Has(inv.TaskID) {
		return changes
	}
	p.advance(now)
	if s == nil || reject != "" {
		return append(changes, Change{Type: taskevent.Rejected, Task: rejection(inv, s == nil || reject == RejectNotFound, now)})
	}
	settings := *s
	if inv.MaxAttempts > 0 {
		settings.MaxAttempts = inv.MaxAttempts
	}
	runAt := inv.RunAt
	if !runAt.After(now) {
		runAt = now
	}
	t := Task{
		ID: inv.TaskID, Namespace: inv.Namespace, Action: inv.Action, Status: store.Queued, Priority: inv.Priority,
		Payload: inv.Payload, IdempotencyKey: inv.IdempotencyKey, Settings: settings, TraceContext: inv.TraceContext,
		Origin: inv.Origin, CreatedAt: inv.InvokedAt, RunAt: runAt, UpdatedAt: now,
	}
	e := p.hold(t.ID)
	p.put(e, t)
	return append(changes, Change{Type: taskevent.Created, Task: t}.madeTo(e))
}

// rejection is the task a REJECTED event reports for inv: its action is
// unknown, or it exists and is disabled.
func rejection(inv Invocation, unknown bool, now time.Time) Task {
	t := Task{
		ID: inv.TaskID, Namespace: inv.Namespace, Action: inv.Action, Origin: inv.Origin,
		TraceContext: inv.TraceContext, CreatedAt: inv.InvokedAt, UpdatedAt: now,
		Outcome: RejectNotFound, Error: fmt.Sprintf("action %q does not exist in namespace %q", inv.Action, inv.Namespace),
	}
	if !unknown {
		t.Outcome = RejectDisabled
		t.Error = fmt.Sprintf("action %q in namespace %q is disabled", inv.Action, inv.Namespace)
	}
	return t
}
