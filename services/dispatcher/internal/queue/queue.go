// Package queue lists dead letters and measures queue depths, from the view
// (the tasks table): reads over many tasks, which the partition owners do not
// answer from memory. The view may trail the owners by one flush window.
package queue

import (
	"context"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/services/dispatcher/internal/catalog"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

// Queue lists dead letters from the view.
type Queue struct {
	pool    *pgxpool.Pool
	catalog *catalog.Catalog
}

// New returns a Queue.
func New(pool *pgxpool.Pool, cat *catalog.Catalog) *Queue {
	return &Queue{pool: pool, catalog: cat}
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
