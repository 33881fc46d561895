-- name: BonusCredit :one
-- Adds amount to the balance, creating it on the first credit; the row lock
-- it takes serialises the account's credits and debits.
INSERT INTO bonus_balances (account_id, balance, updated_at)
VALUES (@account_id, @amount, now())
ON CONFLICT (account_id) DO UPDATE SET balance = bonus_balances.balance + EXCLUDED.balance, updated_at = now()
RETURNING balance;

-- name: BonusDebit :many
-- Subtracts amount only if the balance covers it: no row comes back
-- otherwise. After waiting for a concurrent debit's row lock PostgreSQL
-- re-checks the WHERE clause on the new balance, so concurrent debits can
-- never together take more than there is.
UPDATE bonus_balances
SET balance = balance - @amount, updated_at = now()
WHERE account_id = @account_id AND balance >= @amount
RETURNING balance;

-- name: BonusBalanceGet :one
SELECT coalesce((SELECT balance FROM bonus_balances WHERE account_id = $1), 0)::bigint AS balance;

-- name: BonusEntryCreate :exec
INSERT INTO bonus_entries (account_id, id, kind, amount, reason, balance_after, created_at)
VALUES (@account_id, @id, @kind, @amount, @reason, @balance_after, @created_at);

-- name: BonusEntryCount :one
SELECT count(*) FROM bonus_entries WHERE account_id = $1;
