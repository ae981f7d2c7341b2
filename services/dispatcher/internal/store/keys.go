package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/pg"
)

// APIKey is a row of api_keys. Zero times mean NULL.
type APIKey struct {
	ID        string
	Namespace string
	Role      string
	// SecretHash is SHA-256 of the key's secret part.
	SecretHash []byte
	CreatedAt  time.Time
	ExpiresAt  time.Time
	RevokedAt  time.Time
}

const keyColumns = `id, namespace, role, secret_hash, created_at, expires_at, revoked_at`

func scanKey(r pgx.Row) (APIKey, error) {
	var (
		k                APIKey
		expires, revoked *time.Time
	)
	err := r.Scan(&k.ID, &k.Namespace, &k.Role, &k.SecretHash, &k.CreatedAt, &expires, &revoked)
	k.ExpiresAt, k.RevokedAt = timeOrZero(expires), timeOrZero(revoked)
	return k, err
}

// InsertKey stores a new key that expires ttl after now, or never when ttl
// is zero; pg.ErrConflict when the id is taken.
func InsertKey(ctx context.Context, db DB, id, namespace, role string, secretHash []byte, ttl time.Duration) (APIKey, error) {
	k, err := scanKey(db.QueryRow(ctx, `
INSERT INTO api_keys (id, namespace, role, secret_hash, expires_at)
VALUES ($1, $2, $3, $4, CASE WHEN $5::bigint > 0 THEN now() + $5::bigint * interval '1 millisecond' END)
RETURNING `+keyColumns, id, namespace, role, secretHash, ms(ttl)))
	if err != nil {
		return APIKey{}, fmt.Errorf("insert key %s: %w", id, pg.MapError(err))
	}
	return k, nil
}

// GetKey reads one key; pg.ErrNotFound when there is none.
func GetKey(ctx context.Context, db DB, id string) (APIKey, error) {
	k, err := scanKey(db.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = $1`, id))
	if err != nil {
		return APIKey{}, fmt.Errorf("select key %s: %w", id, pg.MapError(err))
	}
	return k, nil
}

// ListKeys returns keys by id after the given id, only namespace's when
// namespace is not empty.
func ListKeys(ctx context.Context, db DB, namespace, after string, limit int) ([]APIKey, error) {
	rows, err := db.Query(ctx, `SELECT `+keyColumns+` FROM api_keys
WHERE ($1 = '' OR namespace = $1) AND id > $2 ORDER BY id LIMIT $3`, namespace, after, limit)
	if err != nil {
		return nil, fmt.Errorf("select keys: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (APIKey, error) { return scanKey(r) })
	if err != nil {
		return nil, fmt.Errorf("scan keys: %w", err)
	}
	return out, nil
}

// RevokeKey marks a key revoked now, leaving an earlier revocation's time as
// it was; pg.ErrNotFound when there is no such key.
func RevokeKey(ctx context.Context, db DB, id string) (APIKey, error) {
	k, err := scanKey(db.QueryRow(ctx, `
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1
RETURNING `+keyColumns, id))
	if err != nil {
		return APIKey{}, fmt.Errorf("revoke key %s: %w", id, pg.MapError(err))
	}
	return k, nil
}
