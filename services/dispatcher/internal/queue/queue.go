// Package queue answers reads of tasks and brings dead letters back: the
// task operations a person or the gateway asks for by id, as opposed to the
// claim/report traffic of workers.
package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/wake"
	"github.com/razorbill/flo/services/dispatcher/internal/catalog"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// Notifier is told that the outbox has new rows.
type Notifier interface{ Notify() }

// Queue reads tasks and requeues dead letters.
type Queue struct {
	pool    *pgxpool.Pool
	catalog *catalog.Catalog
	hub     *wake.Hub
	relay   Notifier
}

// New returns a Queue.
func New(pool *pgxpool.Pool, cat *catalog.Catalog, hub *wake.Hub, relay Notifier) *Queue {
	return &Queue{pool: pool, catalog: cat, hub: hub, relay: relay}
}

// Get reads one task of a namespace.
func (q *Queue) Get(ctx context.Context, namespace, taskID string) (store.Task, error) {
	id, err := q.parse(ctx, namespace, taskID)
	if err != nil {
		return store.Task{}, err
	}
	t, err := store.GetTask(ctx, q.pool, namespace, id)
	if errors.Is(err, pg.ErrNotFound) {
		return store.Task{}, notFoundTask(namespace, taskID)
	}
	return t, err
}

// ListDeadLetters returns a page of a namespace's dead letters, newest
// first, of one action when action is set, with the token of the next page.
func (q *Queue) ListDeadLetters(ctx context.Context, namespace, action string, p page.Page) ([]store.Task, string, error) {
	if err := q.catalog.CheckNamespace(ctx, namespace); err != nil {
		return nil, "", err
	}
	if action != "" {
		if _, err := q.catalog.Get(ctx, namespace, action); err != nil {
			return nil, "", err
		}
	}
	var after store.DeadLetterKey
	if p.After != nil {
		us, err := p.Int(0)
		if err != nil {
			return nil, "", err
		}
		if after.ID, err = uuid.Parse(p.After[1]); err != nil {
			return nil, "", page.BadToken()
		}
		after.UpdatedAt = time.UnixMicro(us)
	}
	ts, err := store.ListDeadLetters(ctx, q.pool, namespace, action, after, p.Fetch())
	if err != nil {
		return nil, "", err
	}
	ts, next := page.Cut(p, ts, func(t store.Task) []string {
		return []string{strconv.FormatInt(t.UpdatedAt.UnixMicro(), 10), t.ID.String()}
	})
	return ts, next, nil
}

// Requeue queues a dead-lettered task again from attempt zero.
func (q *Queue) Requeue(ctx context.Context, namespace, taskID string) (store.Task, error) {
	id, err := q.parse(ctx, namespace, taskID)
	if err != nil {
		return store.Task{}, err
	}
	var (
		c    store.Change
		task store.Task
	)
	err = pg.InTx(ctx, q.pool, func(tx pgx.Tx) error {
		var err error
		c, err = store.RequeueDeadLetter(ctx, tx, namespace, id)
		if errors.Is(err, pg.ErrNotFound) {
			current, getErr := store.GetTask(ctx, tx, namespace, id)
			if errors.Is(getErr, pg.ErrNotFound) {
				return notFoundTask(namespace, taskID)
			}
			if getErr != nil {
				return getErr
			}
			return fault.Preconditionf("task %s is %s, not dead-lettered", taskID, current.Status)
		}
		if err != nil {
			return err
		}
		rec, err := taskevent.Record(taskevent.Requeued, c, time.Now())
		if err != nil {
			return err
		}
		if err := outbox.Write(ctx, tx, rec); err != nil {
			return fmt.Errorf("write requeued event: %w", err)
		}
		if err := store.Notify(ctx, tx, store.TasksChannel, []string{c.Key()}); err != nil {
			return err
		}
		task, err = store.GetTask(ctx, tx, namespace, id)
		return err
	})
	if err != nil {
		return store.Task{}, fmt.Errorf("requeue task %s: %w", taskID, err)
	}
	q.relay.Notify()
	q.hub.Wake(c.Key())
	return task, nil
}

func (q *Queue) parse(ctx context.Context, namespace, taskID string) (uuid.UUID, error) {
	if err := q.catalog.CheckNamespace(ctx, namespace); err != nil {
		return uuid.UUID{}, err
	}
	id, err := uuid.Parse(taskID)
	if err != nil {
		return uuid.UUID{}, fault.Invalidf("task_id %q is not a UUID", taskID)
	}
	return id, nil
}

func notFoundTask(namespace, taskID string) error {
	return fault.NotFoundf("task %s not found in namespace %s", taskID, namespace)
}
