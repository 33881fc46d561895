-- name: OrderCreate :exec
INSERT INTO orders (account_id, id, status, amount, currency, items, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: OrderCreateGuarded :exec
-- OrderCreate for a claim made at its commit (a pgstore.Batch): the order
-- is written only if its own claim inserted the key row, which it says by
-- calling pgstore's guard (pgstore.Store.Guard, ClaimAtCommit).
INSERT INTO orders (account_id, id, status, amount, currency, items, created_at)
SELECT @account_id, @id, @status, @amount, @currency, @items, @created_at
WHERE idempotency_keys_guard();

-- name: OrderGet :one
SELECT * FROM orders WHERE account_id = $1 AND id = $2;

-- name: OrderListFirst :many
SELECT * FROM orders
WHERE account_id = $1
ORDER BY created_at DESC, id DESC
LIMIT $2;

-- name: OrderListAfter :many
-- The page after the cursor (created_at, id), newest first.
SELECT * FROM orders
WHERE account_id = @account_id AND (created_at, id) < (@cursor_created_at::timestamptz, @cursor_id::uuid)
ORDER BY created_at DESC, id DESC
LIMIT @page_size;

-- name: OrderCount :one
SELECT count(*) FROM orders WHERE account_id = $1;

-- name: OrderGetForUpdate :one
-- The order, locked until the transaction ends: changing, cancelling and
-- paying an order each take this lock before they decide, so they happen
-- one at a time and each sees what the one before it did.
SELECT * FROM orders WHERE account_id = $1 AND id = $2 FOR UPDATE;

-- name: OrderHasActivePayment :one
SELECT EXISTS (
    SELECT 1 FROM payments
    WHERE account_id = $1 AND order_id = $2 AND status IN ('pending', 'succeeded')
);

-- name: OrderUpdate :execrows
UPDATE orders
SET status = @status, amount = @amount, currency = @currency, items = @items, cancelled_at = @cancelled_at
WHERE account_id = @account_id AND id = @id;
