-- +goose Up

-- A payment of an order through the external provider: a long operation.
-- It is created 'pending' in the transaction that claims the client's
-- Idempotency-Key and enqueues its River job, and is made final by the
-- worker in the transaction that also replaces the key's stored 202 with the
-- final response.
CREATE TABLE payments (
    account_id         uuid        NOT NULL,
    id                 uuid        NOT NULL,
    order_id           uuid        NOT NULL,
    amount             bigint      NOT NULL CHECK (amount > 0),
    currency           char(3)     NOT NULL,
    status             text        NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    failure_reason     text        CHECK (failure_reason IN ('card_declined', 'provider_unavailable', 'provider_rejected')),
    provider_charge_id text,
    -- The client's key and the claim time of its row name exactly the key
    -- row this payment answers for: a key reused after it expired is a new
    -- row with another created_at, and the worker's outcome must not land
    -- on it.
    idempotency_key    text        NOT NULL,
    key_created_at     timestamptz NOT NULL,
    created_at         timestamptz NOT NULL,
    completed_at       timestamptz,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, order_id) REFERENCES orders (account_id, id),
    CHECK ((status = 'pending') = (completed_at IS NULL)),
    CHECK ((status = 'failed') = (failure_reason IS NOT NULL)),
    CHECK ((status = 'succeeded') = (provider_charge_id IS NOT NULL))
);
CREATE INDEX payments_account_order_idx ON payments (account_id, order_id);

-- The bonus balance of an account. The CHECK is the last line of defence:
-- debits are guarded in the UPDATE itself (balance >= amount, re-checked by
-- PostgreSQL after waiting for a concurrent debit's row lock), so the
-- balance can never go below zero, whatever runs concurrently.
CREATE TABLE bonus_balances (
    account_id uuid        PRIMARY KEY REFERENCES accounts (id),
    balance    bigint      NOT NULL CHECK (balance >= 0),
    updated_at timestamptz NOT NULL
);

-- Every credit and debit, with the balance right after it.
CREATE TABLE bonus_entries (
    account_id    uuid        NOT NULL REFERENCES accounts (id),
    id            uuid        NOT NULL,
    kind          text        NOT NULL CHECK (kind IN ('credit', 'debit')),
    amount        bigint      NOT NULL CHECK (amount > 0),
    reason        text        NOT NULL CHECK (reason <> ''),
    balance_after bigint      NOT NULL CHECK (balance_after >= 0),
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (account_id, id)
);
CREATE INDEX bonus_entries_account_created_idx ON bonus_entries (account_id, created_at DESC, id DESC);

-- +goose Down
DROP TABLE bonus_entries;
DROP TABLE bonus_balances;
DROP TABLE payments;
