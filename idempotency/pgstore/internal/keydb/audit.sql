-- The operators' audit trail (migration 0004, package keyadmin). Its scope
-- column is bytea whatever the key table's scope type: a scope is sent to
-- it as @scope::bytea, a spelling pgstore's scope rewriting leaves alone,
-- and read back as it is.

-- name: IdempotencyKeyGetForUpdate :one
-- One key's row, locked until the transaction ends, so that an operator's
-- change applies to the state it was judged on: the holder cannot settle
-- the key in between. Its commit is made durable, as the changes' are.
-- The response is read whole (pgstore's access.Response), so that a record
-- whose body is in pieces, stored with status 102, is judged by its real
-- status: it holds an outcome, not a held operation.
SELECT scope::bytea AS scope, idempotency_key, status, response_status, response_headers, response_body, response_pieces, response_size,
       created_at, now()::timestamptz AS now,
       set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true) AS synchronous_commit
FROM idempotency_keys
WHERE scope = CAST(@scope AS bytea) AND idempotency_key = @idempotency_key
FOR UPDATE;

-- name: IdempotencyKeyAuditInsert :one
INSERT INTO idempotency_keys_audit (actor, action, scope, idempotency_key, previous_state, outcome, refusal, reason,
                                    response_status, body_sha256)
VALUES (@actor, @action, @scope::bytea, @idempotency_key, @previous_state, @outcome, @refusal, @reason,
        sqlc.narg(response_status)::integer, sqlc.narg(body_sha256)::bytea)
RETURNING id, at, database_user;

-- name: IdempotencyKeyAuditList :many
-- Audit rows, newest first. An empty scope, prefix or key matches every
-- row; the scope prefix and suffix are compared as bytes.
SELECT id, at, actor, database_user, action, scope, idempotency_key, previous_state, outcome, refusal, reason,
       response_status, body_sha256
FROM idempotency_keys_audit
WHERE (length(@scope::bytea) = 0 OR scope = @scope::bytea)
  AND substr(scope, 1, length(@scope_prefix::bytea)) = @scope_prefix::bytea
  AND (length(@scope_suffix::bytea) = 0 OR (length(scope) >= length(@scope_suffix::bytea)
       AND substr(scope, length(scope) - length(@scope_suffix::bytea) + 1) = @scope_suffix::bytea))
  AND (@idempotency_key::text = '' OR idempotency_key = @idempotency_key::text)
  AND at >= @since::timestamptz
ORDER BY at DESC, id DESC
LIMIT @max_rows;
