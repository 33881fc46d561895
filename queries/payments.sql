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
