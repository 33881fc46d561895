-- +goose Up

-- An account owns API keys, idempotency keys and orders. Every other table is
-- keyed by account_id first, so that each one can be distributed by account.
CREATE TABLE accounts (
    id         uuid        PRIMARY KEY,
    name       text        NOT NULL CHECK (name <> ''),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored only as SHA-256 hashes: a leaked table grants nothing,
-- and a lookup by hash needs no constant-time comparison of secrets.
CREATE TABLE api_keys (
    key_hash   bytea       PRIMARY KEY CHECK (length(key_hash) = 32),
    account_id uuid        NOT NULL REFERENCES accounts (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX api_keys_account_id_idx ON api_keys (account_id);

-- One row per (account, Idempotency-Key). A row is inserted as 'processing'
-- inside the transaction that runs the operation and is updated to
-- 'completed' with the exact response bytes in that same transaction, so no
-- other session ever sees a half-done operation: it sees nothing, or the
-- finished record.
CREATE TABLE idempotency_keys (
    account_id       uuid        NOT NULL,
    idempotency_key  text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint      bytea       NOT NULL CHECK (length(fingerprint) = 32),
    request_method   text        NOT NULL,
    request_route    text        NOT NULL,
    status           text        NOT NULL CHECK (status IN ('processing', 'completed')),
    response_status  integer,
    -- Allow-listed response headers; their order carries no meaning, so jsonb is fine here.
    response_headers jsonb,
    -- The exact response body bytes: bytea, never jsonb, which would reorder keys.
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (account_id, idempotency_key),
    CHECK (status = 'processing' OR (response_status IS NOT NULL AND response_body IS NOT NULL AND completed_at IS NOT NULL))
);
-- Cleanup deletes expired keys in bounded batches in expires_at order.
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

CREATE TABLE orders (
    account_id uuid        NOT NULL REFERENCES accounts (id),
    id         uuid        NOT NULL,
    status     text        NOT NULL CHECK (status IN ('created')),
    amount     bigint      NOT NULL CHECK (amount > 0),
    currency   char(3)     NOT NULL,
    items      jsonb       NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (account_id, id)
);
-- Newest-first listing with a (created_at, id) cursor.
CREATE INDEX orders_account_created_idx ON orders (account_id, created_at DESC, id DESC);

-- +goose Down
DROP TABLE orders;
DROP TABLE idempotency_keys;
DROP TABLE api_keys;
DROP TABLE accounts;
