package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// QueueDepth is what one action's queue holds.
type QueueDepth struct {
	Namespace, Action string
	// Ready tasks can be claimed now; Delayed ones wait for their run_at
	// (a retry's backoff, a delayed invocation).
	Ready, Delayed int64
	// OldestReady is how long the longest-waiting ready task has been
	// claimable; zero when none is.
	OldestReady time.Duration
}

// QueueDepths reads every action's queue in one statement. Each action's
// queued tasks are read through the partial index of queued tasks (whose
// columns hold everything counted), and an action with an empty queue
// reports zeros rather than vanishing.
func QueueDepths(ctx context.Context, db DB) ([]QueueDepth, error) {
	rows, err := db.Query(ctx, `
SELECT a.namespace, a.name, q.ready, q.delayed, q.oldest
FROM actions a
CROSS JOIN LATERAL (
	SELECT count(*) FILTER (WHERE t.run_at <= now()) AS ready,
		count(*) FILTER (WHERE t.run_at > now()) AS delayed,
		COALESCE(EXTRACT(EPOCH FROM now() - min(t.run_at) FILTER (WHERE t.run_at <= now())), 0)::float8 AS oldest
	FROM tasks t
	WHERE t.namespace = a.namespace AND t.action = a.name AND t.state = 'queued'
) q
ORDER BY a.namespace, a.name`)
	if err != nil {
		return nil, fmt.Errorf("read queue depths: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueDepth, error) {
		var (
			d      QueueDepth
			oldest float64
		)
		err := r.Scan(&d.Namespace, &d.Action, &d.Ready, &d.Delayed, &oldest)
		d.OldestReady = time.Duration(oldest * float64(time.Second))
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("read queue depths: %w", err)
	}
	return out, nil
}
