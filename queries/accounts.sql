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
