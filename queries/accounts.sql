-- name: AccountCreate :exec
INSERT INTO accounts (id, name) VALUES ($1, $2);

-- name: APIKeyCreate :exec
INSERT INTO api_keys (key_hash, account_id) VALUES ($1, $2);

-- name: APIKeyGetAccountID :one
SELECT account_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL;

-- name: APIKeyRevoke :execrows
UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1 AND revoked_at IS NULL;

-- name: AccountIDsByName :many
SELECT id FROM accounts WHERE name = $1 ORDER BY created_at LIMIT 10;

-- name: AccountNameLock :exec
-- Held until the transaction ends: creates of one name that refuse a name
-- in use run one at a time, so two of them never both find it free.
SELECT pg_advisory_xact_lock(hashtextextended('oncekey account name ' || @name::text, 0));

-- name: APIKeyDisableDemo :execrows
-- Revokes the demo keys but keep (a hash no key has, to revoke them all).
-- The README's well-known key counts as one wherever it was given, flagged
-- or not: databases migrated before the flag existed hold it unflagged.
UPDATE api_keys SET revoked_at = now()
WHERE (demo OR key_hash = @well_known) AND revoked_at IS NULL AND key_hash <> @keep;

-- name: APIKeyGet :one
SELECT account_id, demo, revoked_at FROM api_keys WHERE key_hash = $1;

-- name: APIKeyEnableDemo :exec
-- The demo key, active again: it was disabled by a start without it.
UPDATE api_keys SET revoked_at = NULL, demo = true WHERE key_hash = $1;

-- name: APIKeyCreateDemo :exec
INSERT INTO api_keys (key_hash, account_id, demo) VALUES ($1, $2, true);

-- name: AccountName :one
SELECT name FROM accounts WHERE id = $1;
