package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/pg"
)

// Workflow is one stored version of a workflow definition, with the switch
// of its name.
type Workflow struct {
	Namespace   string
	Name        string
	Version     string
	YAML        string
	Idempotency string
	StartTarget string
	Steps       []string
	// Enabled applies to every version of the name.
	Enabled bool
	// Latest reports whether this is the name's most recently created
	// version.
	Latest    bool
	CreatedAt time.Time
}

// NameKey names a workflow.
type NameKey struct{ Namespace, Name string }

// VersionKey names one version of a workflow.
type VersionKey struct{ Namespace, Name, Version string }

// Head is what a start needs to know about a workflow name.
type Head struct {
	Enabled       bool
	LatestVersion string
}

const workflowColumns = `v.namespace, v.name, v.version, v.yaml, v.idempotency, v.start_target, v.steps,
	w.enabled, v.version = w.latest_version, v.created_at`

func scanWorkflows(rows pgx.Rows) ([]Workflow, error) {
	defer rows.Close()
	var out []Workflow
	for rows.Next() {
		var w Workflow
		if err := rows.Scan(&w.Namespace, &w.Name, &w.Version, &w.YAML, &w.Idempotency, &w.StartTarget, &w.Steps,
			&w.Enabled, &w.Latest, &w.CreatedAt); err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// CountVersions counts the versions of all workflows of a namespace.
func CountVersions(ctx context.Context, db DB, namespace string) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM workflow_versions WHERE namespace = $1`, namespace).Scan(&n); err != nil {
		return 0, fmt.Errorf("count workflow versions in %s: %w", namespace, err)
	}
	return n, nil
}

// InsertVersion stores w as the newest version of its name (creating the
// name, enabled, when it is new) and returns it as stored. A version that
// exists already gives ErrVersionExists. Run it in a transaction: the name's
// row is locked until commit, so concurrent creates of one name serialise and
// the last to commit is the latest.
func InsertVersion(ctx context.Context, tx pgx.Tx, w Workflow) (Workflow, error) {
	if _, err := tx.Exec(ctx, `
INSERT INTO workflows (namespace, name, latest_version) VALUES ($1, $2, $3)
ON CONFLICT (namespace, name) DO UPDATE SET latest_version = excluded.latest_version, updated_at = now()`,
		w.Namespace, w.Name, w.Version); err != nil {
		return Workflow{}, fmt.Errorf("insert workflow %s: %w", w.Name, err)
	}
	steps := w.Steps
	if steps == nil {
		steps = []string{}
	}
	tag, err := tx.Exec(ctx, `
INSERT INTO workflow_versions (namespace, name, version, yaml, idempotency, start_target, steps)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (namespace, name, version) DO NOTHING`,
		w.Namespace, w.Name, w.Version, w.YAML, w.Idempotency, w.StartTarget, steps)
	if err != nil {
		return Workflow{}, fmt.Errorf("insert workflow %s version %s: %w", w.Name, w.Version, err)
	}
	if tag.RowsAffected() == 0 {
		return Workflow{}, fmt.Errorf("workflow %s version %s: %w", w.Name, w.Version, ErrVersionExists)
	}
	return GetWorkflow(ctx, tx, w.Namespace, w.Name, w.Version)
}

// GetWorkflow reads one version, the latest when version is empty; pg.ErrNotFound
// when there is none.
func GetWorkflow(ctx context.Context, db DB, namespace, name, version string) (Workflow, error) {
	rows, err := db.Query(ctx, `
SELECT `+workflowColumns+`
FROM workflows w JOIN workflow_versions v ON v.namespace = w.namespace AND v.name = w.name
WHERE w.namespace = $1 AND w.name = $2 AND v.version = CASE WHEN $3 = '' THEN w.latest_version ELSE $3 END`,
		namespace, name, version)
	if err != nil {
		return Workflow{}, fmt.Errorf("get workflow %s: %w", name, err)
	}
	ws, err := scanWorkflows(rows)
	if err != nil {
		return Workflow{}, fmt.Errorf("get workflow %s: %w", name, err)
	}
	if len(ws) == 0 {
		return Workflow{}, fmt.Errorf("get workflow %s: %w", name, pg.ErrNotFound)
	}
	return ws[0], nil
}

// WorkflowKey is where a listing of workflows resumes: after this version.
// The zero key starts at the first.
type WorkflowKey struct {
	Name      string
	CreatedAt time.Time
	Version   string
}

// ListWorkflows lists up to limit workflows of a namespace after key, by
// name, only the latest version of each unless allVersions (then newest
// first per name); name filters to one workflow when set.
func ListWorkflows(ctx context.Context, db DB, namespace, name string, allVersions bool, after WorkflowKey, limit int) ([]Workflow, error) {
	rows, err := db.Query(ctx, `
SELECT `+workflowColumns+`
FROM workflows w JOIN workflow_versions v ON v.namespace = w.namespace AND v.name = w.name
WHERE w.namespace = $1 AND ($2 = '' OR w.name = $2) AND ($3 OR v.version = w.latest_version)
	AND (v.name > $4 OR (v.name = $4 AND (v.created_at < $5 OR (v.created_at = $5 AND v.version > $6))))
ORDER BY v.name, v.created_at DESC, v.version
LIMIT $7`,
		namespace, name, allVersions, after.Name, after.CreatedAt, after.Version, limit)
	if err != nil {
		return nil, fmt.Errorf("list workflows: %w", err)
	}
	ws, err := scanWorkflows(rows)
	if err != nil {
		return nil, fmt.Errorf("list workflows: %w", err)
	}
	return ws, nil
}

// SetEnabled switches new starts of every version of a workflow on or off;
// pg.ErrNotFound when the workflow does not exist.
func SetEnabled(ctx context.Context, db DB, namespace, name string, enabled bool) error {
	tag, err := db.Exec(ctx, `UPDATE workflows SET enabled = $3, updated_at = now() WHERE namespace = $1 AND name = $2`,
		namespace, name, enabled)
	if err != nil {
		return fmt.Errorf("set workflow %s enabled: %w", name, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("set workflow %s enabled: %w", name, pg.ErrNotFound)
	}
	return nil
}

// Heads reads the switch and latest version of workflow names; names that do
// not exist are absent from the result.
func Heads(ctx context.Context, db DB, keys []NameKey) (map[NameKey]Head, error) {
	namespaces, names := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		namespaces[i], names[i] = k.Namespace, k.Name
	}
	rows, err := db.Query(ctx, `
SELECT namespace, name, enabled, latest_version FROM workflows
WHERE (namespace, name) IN (SELECT * FROM unnest($1::text[], $2::text[]))`, namespaces, names)
	if err != nil {
		return nil, fmt.Errorf("read workflows: %w", err)
	}
	defer rows.Close()
	out := make(map[NameKey]Head, len(keys))
	for rows.Next() {
		var (
			k NameKey
			h Head
		)
		if err := rows.Scan(&k.Namespace, &k.Name, &h.Enabled, &h.LatestVersion); err != nil {
			return nil, fmt.Errorf("read workflows: %w", err)
		}
		out[k] = h
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read workflows: %w", err)
	}
	return out, nil
}

// VersionYAML reads the YAML of workflow versions; versions that do not
// exist are absent from the result.
func VersionYAML(ctx context.Context, db DB, keys []VersionKey) (map[VersionKey]string, error) {
	namespaces, names, versions := make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		namespaces[i], names[i], versions[i] = k.Namespace, k.Name, k.Version
	}
	rows, err := db.Query(ctx, `
SELECT namespace, name, version, yaml FROM workflow_versions
WHERE (namespace, name, version) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))`, namespaces, names, versions)
	if err != nil {
		return nil, fmt.Errorf("read workflow versions: %w", err)
	}
	defer rows.Close()
	out := make(map[VersionKey]string, len(keys))
	for rows.Next() {
		var (
			k    VersionKey
			yaml string
		)
		if err := rows.Scan(&k.Namespace, &k.Name, &k.Version, &yaml); err != nil {
			return nil, fmt.Errorf("read workflow versions: %w", err)
		}
		out[k] = yaml
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read workflow versions: %w", err)
	}
	return out, nil
}
