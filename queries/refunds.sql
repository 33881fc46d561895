-- name: RefundCreate :exec
INSERT INTO refunds (account_id, id, payment_id, amount, currency, reason, status, idempotency_key, key_created_at, created_at)
VALUES (@account_id, @id, @payment_id, @amount, @currency, @reason, 'pending', @idempotency_key, @key_created_at, @created_at);

-- name: RefundTotals :one
-- What the payment's refunds hold: the sum of those that have not failed,
-- and how many there are in all.
SELECT coalesce(sum(amount) FILTER (WHERE status <> 'failed'), 0)::bigint AS refunded,
       count(*) AS refunds
FROM refunds WHERE account_id = $1 AND payment_id = $2;

-- name: RefundGet :one
SELECT * FROM refunds WHERE account_id = $1 AND id = $2;

-- name: RefundList :many
SELECT * FROM refunds WHERE account_id = $1 AND payment_id = $2 ORDER BY created_at, id;

-- name: RefundFinish :one
-- Makes a pending refund final; a final one is left as it is (no row comes
-- back), as for payments.
UPDATE refunds
SET status = @status, failure_reason = @failure_reason, provider_refund_id = @provider_refund_id, completed_at = @completed_at
WHERE account_id = @account_id AND id = @id AND status = 'pending'
RETURNING *;

-- name: RefundPendingStats :one
-- PaymentPendingStats for refunds (refunds_pending_idx).
SELECT count(*)::bigint AS pending,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_age_seconds
FROM refunds WHERE status = 'pending';

-- name: RefundListPending :many
-- Refunds pending for longer than the given age, oldest first.
SELECT * FROM refunds
WHERE status = 'pending' AND created_at < now() - make_interval(secs => @older_than_seconds::float8)
ORDER BY created_at
LIMIT @max_rows;
