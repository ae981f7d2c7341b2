package engine

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// tokenPrefix versions the token's layout.
const tokenPrefix = "flo1."

// secretBytes is the length of the secret drawn at each claim.
const secretBytes = 16

// Token is the completion token of one attempt: the task id, the attempt and
// the secret drawn when it was claimed, so knowing the id is not enough.
type Token struct {
	ID      uuid.UUID
	Attempt int32
	Secret  []byte
}

// String is the token as callers hold it; empty when the secret is not one
// a claim draws.
func (t Token) String() string {
	if len(t.Secret) != secretBytes {
		return ""
	}
	b := make([]byte, 0, 16+4+secretBytes)
	b = append(b, t.ID[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(t.Attempt))
	b = append(b, t.Secret...)
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// ParseToken reads a token String made.
func ParseToken(s string) (Token, error) {
	raw, ok := strings.CutPrefix(s, tokenPrefix)
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if !ok || err != nil || len(b) != 16+4+secretBytes {
		return Token{}, fault.Invalidf("token is not a completion token")
	}
	var t Token
	copy(t.ID[:], b[:16])
	t.Attempt = int32(binary.BigEndian.Uint32(b[16:20]))
	t.Secret = b[20:]
	return t, nil
}

// Finish is the result a completion token brings.
type Finish struct {
	// Failed ends the task failed with Error and ErrorCode, for good, as a
	// non-retryable error would; otherwise it completes with Result and
	// Outcome.
	Failed    bool
	Result    []byte
	Outcome   string
	Error     string
	ErrorCode string
}

// Finish ends the attempt tok names, running or waiting, as f says, and
// returns the task as it left it. A running attempt is finished too: a
// webhook may beat its handler's pending answer, which then matches nothing.
// A token of no such task of ns, or whose attempt or secret is not the
// task's latest, is fault.NotFound (a wrong secret says no more than an
// unknown task would); one of a task that is no longer running or waiting is
// fault.Precondition.
func (p *Partition) Finish(ns string, tok Token, f Finish, now time.Time) (Task, []Change, error) {
	e, ok := p.tasks[tok.ID]
	if !ok || e.t.Namespace != ns || e.t.Attempt != tok.Attempt || len(e.t.CompletionSecret) == 0 ||
		subtle.ConstantTimeCompare(e.t.CompletionSecret, tok.Secret) != 1 {
		return Task{}, nil, fmt.Errorf("finish task %s by token: %w", tok.ID,
			fault.NotFoundf("no task of namespace %s waits for this token", ns))
	}
	if e.t.Status != store.Running && e.t.Status != store.Waiting {
		return Task{}, nil, fmt.Errorf("finish task %s by token: %w", tok.ID,
			fault.Preconditionf("task %s is %s, not waiting for a result: it was finished already, or its async deadline passed", tok.ID, e.t.Status))
	}
	p.advance(now)
	t := e.t
	typ := taskevent.Completed
	t.Status, t.Result, t.Outcome = store.Completed, f.Result, text.Clean(f.Outcome, text.MaxOutcomeBytes)
	t.Error, t.ErrorCode = "", ""
	if f.Failed {
		typ = taskevent.Failed
		t.Status, t.Result = store.Failed, nil
		t.Error, t.ErrorCode = text.CleanFailure(f.Error, f.ErrorCode)
	}
	t.TimedOut, t.CompleteBy, t.LeaseUntil, t.FinishedAt, t.UpdatedAt = false, time.Time{}, time.Time{}, now, now
	p.put(e, t)
	return t, []Change{{Type: typ, Task: t}}, nil
}
