-- name: BonusCredit :many
-- Adds amount to the balance, creating it on the first credit; the row lock
-- it takes serialises the account's credits and debits. A credit that
-- would take the balance beyond max_balance writes nothing and returns no
-- row; the comparisons subtract, so that no amount can overflow bigint.
WITH credit AS (SELECT @account_id::uuid AS account_id, @amount::bigint AS amount, @max_balance::bigint AS max_balance)
INSERT INTO bonus_balances (account_id, balance, updated_at)
SELECT account_id, amount, now() FROM credit WHERE amount <= max_balance
ON CONFLICT (account_id) DO UPDATE SET balance = bonus_balances.balance + EXCLUDED.balance, updated_at = now()
WHERE (SELECT amount FROM credit) <= (SELECT max_balance FROM credit) - bonus_balances.balance
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
