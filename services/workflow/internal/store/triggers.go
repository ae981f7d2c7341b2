package store

import (
	"context"
	"fmt"
)

// EnabledLatest lists the latest version of every enabled workflow, in every
// namespace: the versions whose stream triggers run.
func EnabledLatest(ctx context.Context, db DB) ([]VersionKey, error) {
	rows, err := db.Query(ctx, `SELECT namespace, name, latest_version FROM workflows WHERE enabled ORDER BY namespace, name`)
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
