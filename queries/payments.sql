-- name: PaymentCreate :exec
INSERT INTO payments (account_id, id, order_id, amount, currency, status, idempotency_key, key_created_at, created_at)
VALUES (@account_id, @id, @order_id, @amount, @currency, 'pending', @idempotency_key, @key_created_at, @created_at);

-- name: PaymentGet :one
SELECT * FROM payments WHERE account_id = $1 AND id = $2;

-- name: PaymentFinish :one
-- Makes a pending payment final. A payment that is already final is left as
-- it is (no row comes back): two workers racing on one payment (a rescued
-- job whose first run was still alive) settle it once.
UPDATE payments
SET status = @status, failure_reason = @failure_reason, provider_charge_id = @provider_charge_id, completed_at = @completed_at
WHERE account_id = @account_id AND id = @id AND status = 'pending'
RETURNING *;

-- name: PaymentCount :one
SELECT count(*) FROM payments WHERE account_id = $1;

-- name: PaymentGetForUpdate :one
-- The payment, locked until the transaction ends: refunds of one payment are
-- created one at a time, each after summing the others.
SELECT * FROM payments WHERE account_id = $1 AND id = $2 FOR UPDATE;

-- name: PaymentGetActiveForOrder :one
-- The order's pending or succeeded payment: at most one
-- (payments_one_active_per_order).
SELECT * FROM payments
WHERE account_id = $1 AND order_id = $2 AND status IN ('pending', 'succeeded');

-- name: PaymentPendingStats :one
-- How many payments are pending, and the age of the oldest (0: none), on
-- every metrics scrape: cheap on the partial index payments_pending_idx.
SELECT count(*)::bigint AS pending,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_age_seconds
FROM payments WHERE status = 'pending';

-- name: PaymentListPending :many
-- Payments pending for longer than the given age, oldest first.
SELECT * FROM payments
WHERE status = 'pending' AND created_at < now() - make_interval(secs => @older_than_seconds::float8)
ORDER BY created_at
LIMIT @max_rows;
