package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/pg"

	"github.com/razorbill/flo/libs/backoff"
)

// CreateNamespaces inserts the namespaces that do not exist yet.
func CreateNamespaces(ctx context.Context, db DB, names []string) error {
	_, err := db.Exec(ctx, `INSERT INTO namespaces (name) SELECT unnest($1::text[]) ON CONFLICT (name) DO NOTHING`, names)
	if err != nil {
		return fmt.Errorf("insert namespaces: %w", err)
	}
	return nil
}

// GetNamespace reads one namespace; pg.ErrNotFound when it does not exist.
func GetNamespace(ctx context.Context, db DB, name string) (Namespace, error) {
	var n Namespace
	err := db.QueryRow(ctx, `SELECT name, created_at FROM namespaces WHERE name = $1`, name).Scan(&n.Name, &n.CreatedAt)
	if err != nil {
		return Namespace{}, fmt.Errorf("select namespace %s: %w", name, pg.MapError(err))
	}
	return n, nil
}

// ListNamespaces returns every namespace by name.
func ListNamespaces(ctx context.Context, db DB, after string, limit int) ([]Namespace, error) {
	rows, err := db.Query(ctx, `SELECT name, created_at FROM namespaces WHERE name > $1 ORDER BY name LIMIT $2`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("select namespaces: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Namespace, error) {
		var n Namespace
		return n, r.Scan(&n.Name, &n.CreatedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("scan namespaces: %w", err)
	}
	return out, nil
}

const actionColumns = `namespace, name, timeout_ms, max_attempts, backoff_kind, backoff_initial_ms, backoff_max_ms, backoff_multiplier, enabled, created_at, updated_at`

func scanAction(r pgx.Row) (Action, error) {
	var (
		a                        Action
		timeout, initial, maxDel int64
		kind                     string
	)
	err := r.Scan(&a.Namespace, &a.Name, &timeout, &a.MaxAttempts, &kind, &initial, &maxDel, &a.Backoff.Multiplier, &a.Enabled, &a.CreatedAt, &a.UpdatedAt)
	a.Timeout = fromMS(timeout)
	a.Backoff.Kind = backoff.Kind(kind)
	a.Backoff.Initial = fromMS(initial)
	a.Backoff.Max = fromMS(maxDel)
	return a, err
}

func collectActions(rows pgx.Rows) ([]Action, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Action, error) { return scanAction(r) })
}

// UpsertAction creates an action or replaces its settings, leaving enabled and
// created_at as they were.
func UpsertAction(ctx context.Context, db DB, namespace, name string, s Settings) (Action, error) {
	row := db.QueryRow(ctx, `
INSERT INTO actions (namespace, name, timeout_ms, max_attempts, backoff_kind, backoff_initial_ms, backoff_max_ms, backoff_multiplier)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (namespace, name) DO UPDATE SET
	timeout_ms = EXCLUDED.timeout_ms,
	max_attempts = EXCLUDED.max_attempts,
	backoff_kind = EXCLUDED.backoff_kind,
	backoff_initial_ms = EXCLUDED.backoff_initial_ms,
	backoff_max_ms = EXCLUDED.backoff_max_ms,
	backoff_multiplier = EXCLUDED.backoff_multiplier,
	updated_at = now()
RETURNING `+actionColumns,
		namespace, name, ms(s.Timeout), s.MaxAttempts, string(s.Backoff.Kind), ms(s.Backoff.Initial), ms(s.Backoff.Max), s.Backoff.Multiplier)
	a, err := scanAction(row)
	if err != nil {
		return Action{}, fmt.Errorf("upsert action %s: %w", Key(namespace, name), err)
	}
	return a, nil
}

// EnsureActions inserts the named actions that do not exist with settings s
// and returns the ones it created.
func EnsureActions(ctx context.Context, db DB, namespace string, names []string, s Settings) ([]Action, error) {
	rows, err := db.Query(ctx, `
INSERT INTO actions (namespace, name, timeout_ms, max_attempts, backoff_kind, backoff_initial_ms, backoff_max_ms, backoff_multiplier)
SELECT $1, n, $3, $4, $5, $6, $7, $8 FROM unnest($2::text[]) AS n
ON CONFLICT (namespace, name) DO NOTHING
RETURNING `+actionColumns,
		namespace, names, ms(s.Timeout), s.MaxAttempts, string(s.Backoff.Kind), ms(s.Backoff.Initial), ms(s.Backoff.Max), s.Backoff.Multiplier)
	if err != nil {
		return nil, fmt.Errorf("insert actions in %s: %w", namespace, err)
	}
	created, err := collectActions(rows)
	if err != nil {
		return nil, fmt.Errorf("insert actions in %s: %w", namespace, err)
	}
	return created, nil
}

// CountActions counts a namespace's actions.
func CountActions(ctx context.Context, db DB, namespace string) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM actions WHERE namespace = $1`, namespace).Scan(&n); err != nil {
		return 0, fmt.Errorf("count actions in %s: %w", namespace, err)
	}
	return n, nil
}

// CountExistingActions counts how many of names are actions of namespace.
func CountExistingActions(ctx context.Context, db DB, namespace string, names []string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM actions WHERE namespace = $1 AND name = ANY($2::text[])`, namespace, names).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("look up actions in %s: %w", namespace, err)
	}
	return n, nil
}

// GetAction reads one action; pg.ErrNotFound when it does not exist.
func GetAction(ctx context.Context, db DB, namespace, name string) (Action, error) {
	a, err := scanAction(db.QueryRow(ctx, `SELECT `+actionColumns+` FROM actions WHERE namespace = $1 AND name = $2`, namespace, name))
	if err != nil {
		return Action{}, fmt.Errorf("select action %s: %w", Key(namespace, name), pg.MapError(err))
	}
	return a, nil
}

// ListActions returns a namespace's actions by name.
func ListActions(ctx context.Context, db DB, namespace, after string, limit int) ([]Action, error) {
	rows, err := db.Query(ctx, `SELECT `+actionColumns+` FROM actions WHERE namespace = $1 AND name > $2 ORDER BY name LIMIT $3`,
		namespace, after, limit)
	if err != nil {
		return nil, fmt.Errorf("select actions in %s: %w", namespace, err)
	}
	out, err := collectActions(rows)
	if err != nil {
		return nil, fmt.Errorf("scan actions in %s: %w", namespace, err)
	}
	return out, nil
}

// LookupActions reads the actions named by parallel namespace/name slices;
// pairs that do not exist are simply absent from the result.
func LookupActions(ctx context.Context, db DB, namespaces, names []string) ([]Action, error) {
	rows, err := db.Query(ctx, `
SELECT `+actionColumns+` FROM actions
WHERE (namespace, name) IN (SELECT * FROM unnest($1::text[], $2::text[]))`, namespaces, names)
	if err != nil {
		return nil, fmt.Errorf("look up actions: %w", err)
	}
	out, err := collectActions(rows)
	if err != nil {
		return nil, fmt.Errorf("scan actions: %w", err)
	}
	return out, nil
}

// SetActionEnabled flips an action's enabled flag; pg.ErrNotFound when it does not exist.
func SetActionEnabled(ctx context.Context, db DB, namespace, name string, enabled bool) (Action, error) {
	a, err := scanAction(db.QueryRow(ctx, `
UPDATE actions SET enabled = $3, updated_at = now() WHERE namespace = $1 AND name = $2
RETURNING `+actionColumns, namespace, name, enabled))
	if err != nil {
		return Action{}, fmt.Errorf("update action %s: %w", Key(namespace, name), pg.MapError(err))
	}
	return a, nil
}

// Notify queues a NOTIFY per key on channel, delivered when the transaction commits.
func Notify(ctx context.Context, db DB, channel string, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if _, err := db.Exec(ctx, `SELECT pg_notify($1, k) FROM unnest($2::text[]) AS k`, channel, keys); err != nil {
		return fmt.Errorf("notify %s: %w", channel, err)
	}
	return nil
}
