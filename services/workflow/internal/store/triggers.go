package store

import (
	"context"
	"fmt"
	"slices"
)

// TriggerCandidates lists the latest version of every enabled workflow, in
// every namespace, whose YAML mentions trigger: the versions whose stream
// triggers run are among them (the parser decides), and workflows without
// one are never parsed for it.
func TriggerCandidates(ctx context.Context, db DB) ([]VersionKey, error) {
	rows, err := db.Query(ctx, `
SELECT w.namespace, w.name, w.latest_version FROM workflows w
JOIN workflow_versions v ON (v.namespace, v.name, v.version) = (w.namespace, w.name, w.latest_version)
WHERE w.enabled AND strpos(v.yaml, 'trigger') > 0
ORDER BY w.namespace, w.name`)
	if err != nil {
		return nil, fmt.Errorf("list enabled workflows: %w", err)
	}
	defer rows.Close()
	var out []VersionKey
	for rows.Next() {
		var k VersionKey
		if err := rows.Scan(&k.Namespace, &k.Name, &k.Version); err != nil {
			return nil, fmt.Errorf("list enabled workflows: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list enabled workflows: %w", err)
	}
	return out, nil
}

// TriggerRecords names stream records a trigger starts a run for.
type TriggerRecords struct {
	Namespace, Workflow string
	// Stream is NAMESPACE/STREAM.
	Stream string
	IDs    []string
}

// ClaimTriggerRecords records runID as the run of those of recs no run has
// yet and returns them. A record a concurrent transaction is claiming waits
// for it to end, so two transactions never both claim one record.
func ClaimTriggerRecords(ctx context.Context, db DB, recs TriggerRecords, runID string) (map[string]bool, error) {
	ids := slices.Sorted(slices.Values(recs.IDs)) // one lock order, no deadlocks between claims
	rows, err := db.Query(ctx, `
INSERT INTO trigger_records (namespace, workflow, stream, record_id, run_id)
SELECT $1, $2, $3, id, $5::uuid FROM unnest($4::text[]) AS id
ON CONFLICT DO NOTHING
RETURNING record_id`, recs.Namespace, recs.Workflow, recs.Stream, ids, runID)
	if err != nil {
		return nil, fmt.Errorf("claim trigger records: %w", err)
	}
	defer rows.Close()
	claimed := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("claim trigger records: %w", err)
		}
		claimed[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim trigger records: %w", err)
	}
	return claimed, nil
}

// TriggerRun returns the run a record started.
func TriggerRun(ctx context.Context, db DB, namespace, workflow, stream, id string) (string, error) {
	var runID string
	err := db.QueryRow(ctx, `SELECT run_id::text FROM trigger_records WHERE namespace = $1 AND workflow = $2 AND stream = $3 AND record_id = $4`,
		namespace, workflow, stream, id).Scan(&runID)
	if err != nil {
		return "", fmt.Errorf("read the run of trigger record %s: %w", id, err)
	}
	return runID, nil
}

// ReleaseTriggerRecords forgets the records claimed for runID, a run that
// is not started after all.
func ReleaseTriggerRecords(ctx context.Context, db DB, runID string) error {
	if _, err := db.Exec(ctx, `DELETE FROM trigger_records WHERE run_id = $1::uuid`, runID); err != nil {
		return fmt.Errorf("release trigger records of run %s: %w", runID, err)
	}
	return nil
}
