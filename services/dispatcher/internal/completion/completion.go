// Package completion finishes waiting tasks: an attempt whose handler
// answered that its result comes later is completed or failed by whoever holds
// its completion token (a webhook handler, another service), or fails as timed
// out when its deadline passes first. A token works from the moment its
// attempt starts, so a webhook that beats the handler's pending answer still
// finishes the task, and that answer is then refused as stale.
package completion

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/sweep"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// expireBatch is how many passed deadlines one transaction handles.
const expireBatch = 1000

// Token is the completion token of one attempt (engine.Token).
func Token(id uuid.UUID, attempt int32, secret []byte) string {
	return engine.Token{ID: id, Attempt: attempt, Secret: secret}.String()
}

// Notifier is told that the outbox has new rows.
type Notifier interface{ Notify() }

// Completions finishes waiting tasks.
type Completions struct {
	pool  *pgxpool.Pool
	relay Notifier
	log   *slog.Logger
	tasks *taskevent.Counters
}

// New returns Completions.
func New(pool *pgxpool.Pool, relay Notifier, log *slog.Logger, meter metric.Meter) (*Completions, error) {
	tasks, err := taskevent.NewCounters(meter)
	if err != nil {
		return nil, err
	}
	return &Completions{pool: pool, relay: relay, log: log, tasks: tasks}, nil
}

// Complete finishes the waiting attempt of tok successfully.
func (c *Completions) Complete(ctx context.Context, namespace, tok string, result []byte, outcome string) (store.Task, error) {
	return c.finish(ctx, namespace, tok, store.Finish{Result: result, Outcome: text.Clean(outcome, text.MaxOutcomeBytes)})
}

// Fail finishes the waiting attempt of tok with a failure. It is final: the
// task fails without another attempt, as a non-retryable error would.
func (c *Completions) Fail(ctx context.Context, namespace, tok, msg, code string) (store.Task, error) {
	msg, code = text.CleanFailure(msg, code)
	return c.finish(ctx, namespace, tok, store.Finish{Failed: true, Error: msg, ErrorCode: code})
}

func (c *Completions) finish(ctx context.Context, namespace, tok string, f store.Finish) (store.Task, error) {
	if err := text.Name("namespace", namespace); err != nil {
		return store.Task{}, err
	}
	t, err := engine.ParseToken(tok)
	if err != nil {
		return store.Task{}, err
	}
	f.ID, f.Namespace, f.Attempt, f.Secret = t.ID, namespace, t.Attempt, t.Secret
	typ := taskevent.Completed
	if f.Failed {
		typ = taskevent.Failed
	}
	var (
		task   store.Task
		events *taskevent.Builder
	)
	err = pg.InTx(ctx, c.pool, func(tx pgx.Tx) error {
		ch, err := store.FinishWaiting(ctx, tx, f)
		if errors.Is(err, pg.ErrNotFound) {
			return whyNot(ctx, tx, namespace, t)
		}
		if err != nil {
			return err
		}
		events = taskevent.NewBuilder(time.Now())
		events.Add(typ, ch)
		if err := events.Write(ctx, tx, "completion"); err != nil {
			return err
		}
		task, err = store.GetTask(ctx, tx, namespace, t.ID)
		return err
	})
	if err != nil {
		return store.Task{}, fmt.Errorf("finish task %s by token: %w", t.ID, err)
	}
	c.tasks.Count(ctx, events)
	c.relay.Notify()
	return task, nil
}

// whyNot explains a token that finished nothing. A token whose secret does
// not match says no more than an unknown task would.
func whyNot(ctx context.Context, tx pgx.Tx, namespace string, t engine.Token) error {
	w, err := store.GetWaitingState(ctx, tx, namespace, t.ID, t.Secret)
	if errors.Is(err, pg.ErrNotFound) || (err == nil && (!w.SecretMatches || w.Attempt != t.Attempt)) {
		return fault.NotFoundf("no task of namespace %s waits for this token", namespace)
	}
	if err != nil {
		return err
	}
	return fault.Preconditionf("task %s is %s, not waiting for a result: it was finished already, or its async deadline passed", t.ID, w.Status)
}

// Run fails waiting tasks whose deadline passed, every interval until ctx
// ends. Several replicas may run it at once.
func (c *Completions) Run(ctx context.Context, interval time.Duration) error {
	return sweep.Every(ctx, interval, c.log, "expire waiting tasks", c.ExpireDue)
}

// ExpireDue fails, as timed out, every waiting task whose deadline passed,
// in batches, and returns how many.
func (c *Completions) ExpireDue(ctx context.Context) (int, error) {
	return sweep.Batches(ctx, expireBatch, c.expireBatch)
}

func (c *Completions) expireBatch(ctx context.Context) (int, error) {
	changes, events, err := taskevent.Sweep(ctx, c.pool, "expiry",
		func(tx pgx.Tx) ([]store.Change, error) { return store.ExpireWaiting(ctx, tx, expireBatch) },
		func(_ pgx.Tx, events *taskevent.Builder, changes []store.Change) error {
			for _, ch := range changes {
				events.Add(taskevent.Failed, ch)
			}
			return nil
		})
	if err != nil {
		return 0, fmt.Errorf("expire waiting tasks: %w", err)
	}
	if len(changes) == 0 {
		return 0, nil
	}
	c.tasks.Count(ctx, events)
	c.relay.Notify()
	c.log.InfoContext(ctx, "waiting tasks passed their async deadline", "count", len(changes))
	return len(changes), nil
}
