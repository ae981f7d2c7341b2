-- +goose Up
-- API keys: a key is flo_<id>_<secret>, and only SHA-256 of the secret is
-- kept, so the table leaks no usable key. The dispatcher owns namespaces, so
-- it owns the keys scoped to them; an admin key has the empty namespace.
-- Keys are never deleted: a revoked or expired key stays listed.
CREATE TABLE api_keys (
	id          text PRIMARY KEY,
	namespace   text NOT NULL,
	role        text NOT NULL CHECK (role IN ('admin', 'client', 'worker', 'read')),
	secret_hash bytea NOT NULL CHECK (length(secret_hash) = 32),
	created_at  timestamptz NOT NULL DEFAULT now(),
	expires_at  timestamptz,
	revoked_at  timestamptz,
	CHECK ((role = 'admin') = (namespace = ''))
);
-- ListKeys of one namespace, by id.
CREATE INDEX api_keys_namespace_idx ON api_keys (namespace, id);

-- +goose Down
DROP TABLE api_keys;
